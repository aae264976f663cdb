"""`longsparse eval ruler` and `longsparse eval compare` end to end, with fake models through --backend."""

import json

import pytest

from longsparse import cli
from longsparse.eval.cli import check_lengths, default_run_name, load_factory, select_tasks


def _ruler(tmp_path, backend, name, *extra):
    out = tmp_path / f"{name}.json"
    argv = ["eval", "ruler", "--backend", f"tests.eval.fakes:{backend}", "--model", "fake", "--name", name]
    argv += ["--lengths", "1k,2k", "--samples", "2", "--seed", "5", "--out", str(out), "--no-progress", *extra]
    assert cli.main(argv) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    tasks = "niah_single_2,niah_multikey_3,vt,cwe,fwe,qa_1"
    return {
        "oracle": _ruler(tmp, "oracle", "oracle", "--tasks", tasks),
        "half": _ruler(tmp, "half", "half", "--tasks", tasks, "--batch-size", "3"),
        "wrong": _ruler(tmp, "wrong", "wrong", "--tasks", "niah_single_2,vt"),
    }


def test_ruler_writes_json_plot_and_table(runs, capsys):
    data = json.loads(runs["oracle"].read_text())
    assert data["kind"] == "ruler" and data["summary"]["score"] == 100.0
    assert data["summary"]["per_length"] == {"1024": 100.0, "2048": 100.0}
    assert set(data["missing_tasks"]) == {"qa_1"} and "SQuAD" in data["missing_tasks"]["qa_1"]
    assert len(data["samples"]) == 5 * 2 * 2
    assert data["config"]["max_new_tokens"] == {
        "niah_single_2": 128,
        "niah_multikey_3": 128,
        "vt": 30,
        "cwe": 120,
        "fwe": 50,
    }
    assert runs["oracle"].with_suffix(".png").stat().st_size > 1000
    assert json.loads(runs["wrong"].read_text())["summary"]["score"] == 0.0


def test_ruler_prints_the_table(tmp_path, capsys):
    _ruler(tmp_path, "oracle", "printed", "--tasks", "fwe,qa_2", "--lengths", "1k")
    out = capsys.readouterr()
    assert "fwe" in out.out and "average" in out.out and "qa_2: missing" in out.out
    assert "skipping qa_2" in out.err


def test_same_seed_gives_the_same_samples_across_runs(runs):
    a = json.loads(runs["oracle"].read_text())["samples"]
    b = json.loads(runs["half"].read_text())["samples"]
    assert [(r["id"], r["prompt_sha1"]) for r in a] == [(r["id"], r["prompt_sha1"]) for r in b]


def test_compare_reports_the_paired_difference(runs, tmp_path, capsys):
    out = tmp_path / "cmp.json"
    argv = ["eval", "compare", str(runs["oracle"]), str(runs["half"]), "--resamples", "2000", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "overall" in printed and "B - A" in printed
    data = json.loads(out.read_text())
    half = json.loads(runs["half"].read_text())["summary"]["score"]
    assert data["summary"]["difference"] == pytest.approx(half - 100.0)
    assert data["summary"]["low"] <= data["summary"]["difference"] <= data["summary"]["high"] <= 0.0
    assert set(data["per_length"]) == {"1024", "2048"} and "vt" in data["per_task"]
    assert out.with_suffix(".png").exists()


def test_compare_refuses_runs_on_other_samples(runs, tmp_path, capsys):
    seed5 = _ruler(tmp_path, "oracle", "seed5", "--tasks", "vt")
    seed6 = _ruler(tmp_path, "oracle", "seed6", "--tasks", "vt", "--seed", "6")
    capsys.readouterr()
    assert cli.main(["eval", "compare", str(seed5), str(seed6)]) == 2
    assert "different prompts" in capsys.readouterr().err
    assert cli.main(["eval", "compare", str(runs["oracle"]), str(seed5)]) == 2
    assert "different samples" in capsys.readouterr().err


def test_task_selection():
    tasks, missing = select_tasks("all")
    assert len(tasks) == 11 and set(missing) == {"qa_1", "qa_2"}
    assert select_tasks("vt, cwe,vt") == (["vt", "cwe"], {})
    with pytest.raises(ValueError, match="unknown"):
        select_tasks("vt,niah")
    with pytest.raises(ValueError, match="none of the requested"):
        select_tasks("qa_1")


def test_backend_and_names():
    from tests.eval import fakes

    assert load_factory("tests.eval.fakes:oracle") is fakes.oracle
    for bad in ("tests.eval.fakes", "tests.eval.fakes:nothing", "no_such_module:x", "tests.eval.fakes:re"):
        with pytest.raises(ValueError, match="--backend"):
            load_factory(bad)
    assert default_run_name("/models/Qwen3.5-4B", "sparse", "sparda") == "ruler-Qwen3.5-4B-gdn_sparse-attn_sparda"


def test_ruler_passes_sparse_attention_options_to_the_factory(tmp_path):
    from longsparse.ops.sparse_attn import SparseAttentionConfig
    from tests.eval import fakes

    fakes.OPTIONS.clear()
    out = _ruler(tmp_path, "options", "plain", "--tasks", "vt", "--lengths", "1k")
    assert fakes.OPTIONS == [{}]  # factories without these keywords keep working
    out = _ruler(tmp_path, "options", "sparda", "--tasks", "vt", "--lengths", "1k", "--attention", "sparda",
                 "--forecast", "adapter-dir", "--sparse-attention-config", "block_size=32,window=64")  # fmt: skip
    assert fakes.OPTIONS[1] == {
        "forecast": "adapter-dir",
        "sparse_attention_config": SparseAttentionConfig(block_size=32, window=64),
    }
    config = json.loads(out.read_text())["config"]
    assert config["forecast"] == "adapter-dir" and config["sparse_attention_config"] == "block_size=32,window=64"


def test_ruler_passes_a_sparse_gdn_config_to_the_factory(tmp_path, capsys):
    from longsparse.ops.gdn import SparseGDNConfig
    from tests.eval import fakes

    fakes.OPTIONS.clear()
    out = _ruler(tmp_path, "options", "random", "--tasks", "vt", "--lengths", "1k", "--gdn", "sparse",
                 "--gdn-config", "selection=random,seed=7")  # fmt: skip
    assert fakes.OPTIONS == [{"sparse_gdn_config": SparseGDNConfig(selection="random", seed=7)}]
    assert json.loads(out.read_text())["config"]["gdn_config"] == "selection=random,seed=7"
    argv = ["eval", "ruler", "--backend", "tests.eval.fakes:options", "--model", "fake", "--tasks", "vt"]
    assert cli.main(argv + ["--lengths", "1k", "--gdn-config", "selection=random"]) == 2
    assert "--gdn-config configures --gdn sparse" in capsys.readouterr().err


def test_ruler_refuses_lengths_beyond_the_context():
    check_lengths([4096, 8192], 8192)
    check_lengths([4096], None)  # a backend that does not say its context
    with pytest.raises(ValueError, match="--lengths: 16,384 tokens exceed the model's context of 8,192 tokens"):
        check_lengths([4096, 16384], 8192)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--samples", "0"], "argument --samples: must be at least 1, got 0"),
        (["--batch-size", "x"], "argument --batch-size: 'x' is not a whole number"),
        (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["--tasks", "nope"], "--tasks: unknown ['nope']"),
        (["--lengths", "4q"], "length must be an integer, optionally with a K suffix"),
    ],
    ids=["zero-samples", "text-batch", "bad-dtype", "unknown-task", "bad-length"],
)
def test_ruler_errors_are_one_line(capsys, extra, message):
    argv = ["eval", "ruler", "--backend", "tests.eval.fakes:oracle", "--model", "fake", "--no-progress"]
    assert cli.main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_parse_sparse_gdn_config_reads_every_field_type():
    from longsparse.cli_args import parse_sparse_gdn_config
    from longsparse.ops.gdn import SparseGDNConfig

    got = parse_sparse_gdn_config(
        "selection=fixed_tiers, fixed_tiers=10/4/2, tier_ratios=0.1/0.3/0.9, visibility=false, tail=8, "
        "warmup_log_decay=none"
    )
    assert got == SparseGDNConfig(selection="fixed_tiers", fixed_tiers=(10, 4, 2), tier_ratios=(0.1, 0.3, 0.9),
                                  visibility=False, tail=8, warmup_log_decay=None)  # fmt: skip
    assert parse_sparse_gdn_config("") == SparseGDNConfig()
    for bad, message in (
        ("selection", "not KEY=VALUE"),
        ("budget=3", "unknown field 'budget'"),
        ("tail=many", "tail"),
        ("visibility=yes", "visibility"),
        ("selection=best", "selection must be one of"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_sparse_gdn_config(bad)
