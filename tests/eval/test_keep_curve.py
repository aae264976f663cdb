"""The accuracy-vs-keep curve: its variants, its result (points, summary keys with paired intervals), its plot, and
`longsparse eval keep-curve` end to end on a tiny Llama, resumed from the runs it saved."""

import json

import pytest

from longsparse.cli import main
from longsparse.eval.keep_curve import curve_result, curve_variants, plot_curve, run_name
from longsparse.eval.report import RulerRun
from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.tasks.ruler import Sample
from tests.helpers import one_thread
from tests.tiny_models import EOS, build, random_ids, save, write_tokenizer

BASE = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=2, kernel_size=8, kernel_stride=4,
                             dense_len=0)  # fmt: skip


def test_curve_variants_run_each_mode_at_each_budget():
    variants = curve_variants(["dense", "oracle", "sparse"], [2, 4], BASE)
    assert [v.name for v in variants] == ["dense", "oracle-topk2", "sparse-topk2", "oracle-topk4", "sparse-topk4"]
    assert variants[3].config.topk == 4 and variants[3].config.window == BASE.window
    with pytest.raises(ValueError, match="modes must be among"):
        curve_variants(["quest"], [2], BASE)
    with pytest.raises(ValueError, match="topk"):
        curve_variants(["sparse"], [0], BASE)


def _run(name, scores, keep):
    records = [
        dict(
            id=f"vt/{n}/{i}",
            task="vt",
            target_length=n,
            prompt_sha1=f"{n}{i}",
            score=s,
            attention_keep=keep,
            attention_prefill_keep=None if keep is None else 2 * keep,
        )  # fmt: skip
        for n in (4096, 8192)
        for i, s in enumerate(scores)
    ]
    return RulerRun(name, {}, records)


def test_curve_result_has_the_summary_keys_and_a_point_per_run_and_length(tmp_path):
    runs = {
        "dense": _run("dense", [1.0] * 8, None),
        run_name("oracle", 16): _run("o", [1.0] * 8, 0.3),
        run_name("sparse", 16): _run("s", [1.0] * 6 + [0.0] * 2, 0.3),
        run_name("sparda", 16): _run("f", [1.0] * 7 + [0.0], 0.3),
        run_name("sparse", 32): _run("s32", [1.0] * 8, 0.5),
    }
    result = curve_result(runs, 16, resamples=2000)
    s = result["summary"]
    assert (s["dense_score"], s["oracle_score"], s["sparse_score"], s["sparda_score"]) == (100.0, 100.0, 75.0, 87.5)
    assert s["keep_ratio"] == 0.3 and s["samples"] == 16
    assert s["sparse_minus_dense"]["difference"] == pytest.approx(-25.0) and s["sparse_minus_dense"]["low"] < -25
    assert s["per_length"]["8192"]["sparda_minus_dense"]["difference"] == pytest.approx(-12.5)
    points = {(p["mode"], p["topk"], p["length"]): p for p in result["points"]}
    assert len(points) == 5 * 3
    assert points["sparse", 32, "4096"]["keep_ratio"] == 0.5 and points["sparse", 32, "all"]["difference"] == 0.0
    assert points["sparse", 16, "all"]["prefill_keep_ratio"] == 0.6
    assert plot_curve(tmp_path / "curve.png", result).stat().st_size > 10_000
    with pytest.raises(ValueError, match="needs the dense run"):
        curve_result({k: v for k, v in runs.items() if k != "dense"}, 16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    hf = build("llama-gqa-bias", seed=3, num_hidden_layers=2, num_attention_heads=6, hidden_size=96,
               eos_token_id=EOS, bos_token_id=None)  # fmt: skip
    path = save(hf, tmp_path_factory.mktemp("llama"))
    write_tokenizer(path)
    return path


def test_keep_curve_command_runs_saves_and_resumes(checkpoint, tmp_path, capsys):
    samples = []
    for n in (96, 160):
        for i in range(3):
            ids = random_ids(n - 8, seed=n + i)
            prompt = " ".join(f"w{t % 100}" for t in ids)
            samples.append(Sample("niah_single_2", i, 42, n, prompt, (f"w{ids[20] % 100}",), len(ids), 4).as_dict())
    samples_file = tmp_path / "samples.json"
    samples_file.write_text(json.dumps({"seed": 42, "samples": samples}))
    out, runs = tmp_path / "curve.json", tmp_path / "runs"
    args = ["eval", "keep-curve", "--model", str(checkpoint), "--modes", "dense,oracle,sparse", "--topk", "2,6",
            "--geometry", "block_size=16,window=32,kernel_size=8,kernel_stride=4,topk=2", "--lengths", "96,160",
            "--tasks", "niah_single_2", "--samples", "3", "--samples-file", str(samples_file),
            "--runs-dir", str(runs), "--out", str(out), "--batch-size", "2", "--device", "cpu"]  # fmt: skip
    with one_thread():
        assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "keep-curve" and data["summary"]["summary_topk"] == 2
    assert sorted(p.stem for p in runs.glob("*.json")) == ["dense", "oracle-topk2", "oracle-topk6", "sparse-topk2",
                                                           "sparse-topk6"]  # fmt: skip
    keep = {(p["mode"], p["topk"]): p["keep_ratio"] for p in data["points"] if p["length"] == "160"}
    assert keep["sparse", 2] < keep["sparse", 6] <= 1.0 and keep["oracle", 2] == keep["sparse", 2]
    assert data["summary"]["samples"] == 6 and out.with_suffix(".png").exists()
    capsys.readouterr()
    assert main([*args[:-4], "--out", str(tmp_path / "again.json"), "--summarize-only"]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["summary"] == data["summary"]
