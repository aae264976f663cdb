"""`longsparse train-forecast` and `longsparse eval recall` end to end on a tiny checkpoint folder."""

import json

import pytest
import torch

from longsparse import LLM
from longsparse.cli import main
from longsparse.models import load_model
from tests.tiny_models import build, save, write_tokenizer

GEOMETRY = ["--block-size", "16", "--window", "32", "--topk", "6", "--kernel-size", "8", "--kernel-stride", "4"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = save(build("llama-gqa-bias", seed=6), tmp_path_factory.mktemp("llama"))
    write_tokenizer(path)
    gen = torch.Generator().manual_seed(0)
    words = " ".join(f"w{i}" for i in torch.randint(0, 100, (2500,), generator=gen).tolist())
    (path / "text.txt").write_text(words)
    return path


def _train(folder, out, steps, *extra):
    args = ["train-forecast", "--model", str(folder), "--data", str(folder / "text.txt"), "--out", str(out)]
    args += ["--seq-len", "203", "--steps", str(steps), "--positions", "16", "--checkpoint-every", "1"]
    return main(args + GEOMETRY + ["--no-progress", *extra])


@pytest.fixture(scope="module")
def adapter(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("adapter")
    assert _train(folder, out, 2, "--keep-snapshots", "--teacher", "coarse") == 0
    return out


def test_train_writes_adapter_log_checkpoint_and_snapshots(adapter):
    config = json.loads((adapter / "forecast.json").read_text())
    assert config["layers"] == [0] and config["current_layer"] == 0 and config["num_kv_heads"] == 2
    assert config["sparse_config"]["window"] == 32 and config["training"]["teacher"] == "coarse"
    lines = [json.loads(x) for x in (adapter / "train.log").read_text().splitlines()]
    assert lines[0]["arguments"]["teacher"] == "coarse" and lines[0]["arguments"]["out"] == str(adapter)
    assert lines[0]["config"]["steps"] == 2 and [x["step"] for x in lines[1:]] == [1, 2]
    assert (adapter / "checkpoint.pt").is_file()
    assert (adapter / "steps" / "1" / "forecast.safetensors").is_file()


def test_resume_continues_the_log_and_the_steps(folder, tmp_path):
    assert _train(folder, tmp_path, 1) == 0
    assert _train(folder, tmp_path, 2, "--resume") == 0
    lines = [json.loads(x) for x in (tmp_path / "train.log").read_text().splitlines()]
    assert [x.get("resumed") for x in lines if "arguments" in x] == [False, True]
    assert [x["step"] for x in lines if "step" in x] == [1, 2]


def test_adapter_loads_beside_its_base_model(folder, adapter):
    llm = LLM(str(folder), forecast=adapter)
    assert llm.loaded.model.forecast is not None
    assert sorted(llm.loaded.model.forecast.state_dict()) == ["forecast.0.weight", "forecast_current.0.weight"]
    assert load_model(folder).model.forecast is None


def test_bad_arguments_exit_with_an_error(folder, tmp_path, capsys):
    assert _train(folder, tmp_path, 1, "--betas", "0.9") == 2
    assert "--betas takes two comma-separated numbers" in capsys.readouterr().err
    assert _train(folder, tmp_path, 1, "--teacher-chunk", "0") == 2


def test_eval_recall_writes_the_summary(folder, adapter, tmp_path):
    out = tmp_path / "forecast.json"
    args = ["eval", "recall", "--model", str(folder), "--adapter", f"forecast={adapter}", "--untrained", "--random"]
    args += ["--data", str(folder / "text.txt"), "--lengths", "203", "--sequences", "1", "--positions", "16"]
    assert main(args + ["--out", str(out)]) == 0
    data = json.loads(out.read_text())
    for name in ("forecast", "infllmv2", "untrained", "random", "oracle"):
        assert 0 <= data["summary"][f"recall_{name}"] <= data["summary"]["recall_oracle"] + 1e-9
    assert {r["layer"] for r in data["rows"]} == {0, 1} and data["name"] == "forecast"


def test_generate_loads_the_adapter_and_refuses_one_for_another_model(folder, adapter, tmp_path, capsys):
    from longsparse.models.forecast import ForecastConfig, ForecastProjections
    from tests.train.tiny import tiny_llama

    args = ["generate", "--model", str(folder), "--prompt", "w1 w2 w3", "--max-new-tokens", "2"]
    assert main(args + ["--forecast", str(adapter)]) == 0
    ForecastProjections(ForecastConfig.for_model(tiny_llama().config, "other")).save(tmp_path)
    assert main(args + ["--forecast", str(tmp_path)]) == 2
    assert "forecast adapter for 'other' does not fit this model (attention_layers" in capsys.readouterr().err
