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


def write_samples(folder, count: int, lengths=(96, 160)):
    """A samples file of ``count`` niah_single_2 prompts of random words per length (seed 42), as
    ``ruler_samples`` reads it."""
    samples = []
    for n in lengths:
        for i in range(count):
            ids = random_ids(n - 8, seed=n + i)
            prompt = " ".join(f"w{t % 100}" for t in ids)
            samples.append(Sample("niah_single_2", i, 42, n, prompt, (f"w{ids[20] % 100}",), len(ids), 4).as_dict())
    path = folder / "samples.json"
    path.write_text(json.dumps({"seed": 42, "samples": samples}))
    return path


def test_keep_curve_command_runs_saves_and_resumes(checkpoint, tmp_path, capsys):
    samples_file = write_samples(tmp_path, 3)
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


def _script(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_diagnostics_grid_writes_each_rules_quality_json_and_resumes(checkpoint, tmp_path, capsys):
    """scripts/sparse_diagnostics.py, the command of the decisive GPU run, at a tiny size on the CPU: dense, the
    oracle on the first sample of each length only, the current rule and two candidates; each rule's
    quality/<rule>.json holds the summary keys; a second call keeps the runs it finds."""
    diagnostics = _script("sparse_diagnostics")
    samples_file = write_samples(tmp_path, 2)
    out = tmp_path / "out"
    args = ["--model", str(checkpoint), "--forecast", "random", "--out", str(out), "--lengths", "96,160",
            "--tasks", "niah_single_2", "--samples", "2", "--samples-file", str(samples_file),
            "--base", "block_size=16,window=32,kernel_size=8,kernel_stride=4,topk=2",
            "--variants", "sparse,sparda,oracle@1,sparse.cmp16,sparda.cmp16,sparse.sumpool",
            "--trace-samples", "0", "--batch-size", "2", "--device", "cpu"]  # fmt: skip
    with one_thread():
        assert diagnostics.main(args) == 0
    assert sorted(p.stem for p in (out / "quality").glob("*.json")) == ["cmp16", "current", "sumpool"]
    current = json.loads((out / "quality" / "current.json").read_text())
    summary = current["summary"]
    for key in ("dense_score", "oracle_score", "sparse_score", "sparda_score", "keep_ratio", "samples"):
        assert summary[key] is not None, key
    for key in ("sparse_minus_dense", "sparda_minus_dense"):
        assert {"difference", "low", "high"} <= set(summary[key])
    assert summary["samples"] == 2  # the oracle's paired samples: one per length
    sumpool = json.loads((out / "quality" / "sumpool.json").read_text())
    assert "sparda_score" not in sumpool["summary"] and sumpool["rule"]["changes"] == {"pool_reduce": "sum"}
    capsys.readouterr()
    with one_thread():
        assert diagnostics.main(args) == 0
    assert capsys.readouterr().err.count("kept from") == 7
    variants = diagnostics.grid(diagnostics.BASE)
    assert "sparda.groupmax" not in variants and "sparse.quest64" not in variants
    assert variants["sparse.cmp8"].config.kernel_size == 8
    assert variants["sparda.neighbour1"].config.neighbour_blocks == 1


def test_gpu_run_script_writes_quality_attn_and_finishes_from_a_previous_sitting(checkpoint, tmp_path):
    """scripts/h200_sparse_accuracy.sh on the CPU at a tiny size: the first sitting runs out of time after one
    variant (TIME_BUDGET=0), the second, given the first's runs, finishes the grid and writes quality_attn.json."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    samples_file = write_samples(tmp_path, 1)
    env = {**os.environ, "MODEL": str(checkpoint), "FORECAST": "random", "SAMPLES_FILE": str(samples_file),
           "SAMPLES_PER_CELL": "1", "ORACLE_SAMPLES": "1", "DENSE_LAYERS": "1", "OMP_NUM_THREADS": "1",
           "EXTRA": "--base block_size=16,window=32,kernel_size=8,kernel_stride=4,topk=2 --lengths 96,160 "
                    "--tasks niah_single_2 --device cpu --batch-size 2"}  # fmt: skip
    first, second = tmp_path / "first", tmp_path / "second"
    script = str(root / "scripts" / "h200_sparse_accuracy.sh")
    subprocess.run(["bash", script], env={**env, "OUT": str(first), "TIME_BUDGET": "0"}, cwd=root, check=True)
    assert [p.stem for p in (first / "grid" / "runs").glob("*.json")] == ["dense"]
    assert not (first / "quality_attn.json").exists()
    subprocess.run(["bash", script], env={**env, "OUT": str(second), "PREVIOUS": str(first / "grid")}, cwd=root,
                   check=True)  # fmt: skip
    runs = sorted(p.stem for p in (second / "grid" / "runs").glob("*.json"))
    assert runs == ["dense", "oracle", "sparda", "sparda.cmp8", "sparda.cmp8.dl", "sparda.cmp8.topk40", "sparse",
                    "sparse.cmp8", "sparse.cmp8.dl", "sparse.cmp8.topk40"]  # fmt: skip
    quality = json.loads((second / "quality_attn.json").read_text())
    assert quality["rule"]["name"] == "cmp8" and {"dense_score", "sparse_minus_dense"} <= set(quality["summary"])
    dense = json.loads((second / "grid" / "runs" / "dense.json").read_text())
    assert dense == json.loads((first / "grid" / "runs" / "dense.json").read_text())  # kept, not run again
