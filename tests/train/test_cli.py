"""`longsparse train-forecast`, `longsparse generate --attention sparda --forecast` and `longsparse eval recall` end to
end on a tiny checkpoint folder."""

import json

import pytest
import torch
from safetensors.torch import load_file

from longsparse import LLM
from longsparse.cli import main
from longsparse.models.forecast import CONFIG_FILE, WEIGHTS_FILE, ForecastProjections
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.tiny_models import TINY, build, save, write_tokenizer

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
    config = json.loads((adapter / CONFIG_FILE).read_text())
    assert config["layers"] == [0] and config["attention_layers"] == [0, 1] and config["num_kv_heads"] == 2
    assert config["sparse_config"]["window"] == 32 and config["training"]["teacher"] == "coarse"
    assert sorted(load_file(str(adapter / WEIGHTS_FILE))) == ["forecast.0.weight", "forecast_current.0.weight"]
    assert all(t.dtype == torch.bfloat16 for t in load_file(str(adapter / WEIGHTS_FILE)).values())
    lines = [json.loads(x) for x in (adapter / "train.log").read_text().splitlines()]
    assert lines[0]["arguments"]["teacher"] == "coarse" and lines[0]["arguments"]["out"] == str(adapter)
    assert lines[0]["config"]["steps"] == 2 and [x["step"] for x in lines[1:]] == [1, 2]
    assert (adapter / "checkpoint.pt").is_file()
    assert (adapter / "steps" / "1" / "forecast.safetensors").is_file()


def test_resume_continues_identically(folder, adapter, tmp_path):
    """One step, then --resume to two: the log continues and the adapter equals the uninterrupted run's bit for bit."""
    assert _train(folder, tmp_path, 1, "--teacher", "coarse") == 0
    assert _train(folder, tmp_path, 2, "--teacher", "coarse", "--resume") == 0
    lines = [json.loads(x) for x in (tmp_path / "train.log").read_text().splitlines()]
    assert [x.get("resumed") for x in lines if "arguments" in x] == [False, True]
    assert [x["step"] for x in lines if "step" in x] == [1, 2]
    resumed, whole = load_file(str(tmp_path / WEIGHTS_FILE)), load_file(str(adapter / WEIGHTS_FILE))
    assert sorted(resumed) == sorted(whole) and all(torch.equal(resumed[k], whole[k]) for k in whole)
    whole_losses = [json.loads(x)["loss"] for x in (adapter / "train.log").read_text().splitlines()[1:]]
    assert [x["loss"] for x in lines if "step" in x] == whole_losses


def test_generate_with_the_trained_adapter(folder, adapter, capsys):
    """The adapter drives sparda attention in its trained geometry (window 32, not MiniCPM4's default)."""
    prompt = " ".join(f"w{i % 97}" for i in range(150))
    args = ["generate", "--model", str(folder), "--prompt", prompt, "--max-new-tokens", "3", "--attention", "sparda"]
    assert main(args + ["--forecast", str(adapter)]) == 0
    err = capsys.readouterr().err
    assert "attention sparda, KV blocks attended" in err and "RANDOM" not in err
    llm = LLM(str(folder), attention="sparda", forecast=adapter)
    trained = SparseAttentionConfig(block_size=16, window=32, topk=6, kernel_size=8, kernel_stride=4, dense_len=0)
    assert llm.loaded.model.sparse_attention_config == trained
    emitter = llm.loaded.model.model.layers[0].mixer.forecasters[1]
    assert emitter.target == 1
    assert torch.equal(emitter.weight, load_file(str(adapter / WEIGHTS_FILE))["forecast.0.weight"].float())


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


def test_generate_refuses_an_adapter_for_another_model(folder, tmp_path, capsys):
    from longsparse.models.config import decoder_config_from_hf

    deeper = decoder_config_from_hf({**TINY, "num_hidden_layers": 3}, "LlamaForCausalLM")
    ForecastProjections.for_model(deeper, "other").save(tmp_path)
    args = ["generate", "--model", str(folder), "--prompt", "w1 w2 w3", "--max-new-tokens", "2"]
    assert main(args + ["--attention", "sparda", "--forecast", str(tmp_path)]) == 2
    assert "adapter for 'other': it was made for num_hidden_layers 3, the model's are 2" in capsys.readouterr().err
