"""Requests beyond what the model or the machine holds are refused with the numbers, before anything runs: a prompt
(plus max_new_tokens) beyond the model's context unless truncation is asked for, a KV cache beyond the memory there
is on a CPU device, a CUDA device the machine does not have, sampling values that are not numbers."""

import re

import pytest
import torch

from longsparse import LLM
from longsparse.cache import CapacityError
from longsparse.engine import api
from tests.helpers import one_thread
from tests.tiny_models import TINY, build, random_ids, save, write_tokenizer

CONTEXT = TINY["max_position_embeddings"]  # 256


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = save(build("llama-gqa-bias", seed=29, eos_token_id=100), tmp_path_factory.mktemp("tiny"))
    write_tokenizer(path)
    return LLM(path)


@pytest.mark.parametrize(
    "length, max_new_tokens, message",
    [
        (300, 4, "prompt 0 has 300 tokens, more than the model's context of 256; pass truncate_prompt='left' or "
                 "'right' (--truncate-prompt) to cut the prompt to 252 tokens"),
        (256, 1, "prompt 0 has 256 tokens, and with max_new_tokens=1 that makes 257, more than the model's context of "
                 "256; pass truncate_prompt='left' or 'right' (--truncate-prompt) to cut the prompt to 255 tokens"),
        (200, 57, "prompt 0 has 200 tokens, and with max_new_tokens=57 that makes 257, more than the model's context "
                  "of 256; lower max_new_tokens to 56 or less, or pass truncate_prompt='left' or 'right'"),
        (3, 256, "prompt 0 has 3 tokens, and with max_new_tokens=256 that makes 259, more than the model's context of "
                 "256; max_new_tokens must be below 256"),
    ],
    ids=["prompt-beyond", "prompt-fills", "with-new-tokens", "new-tokens-fill"],
)  # fmt: skip
def test_a_request_beyond_the_context_is_refused_with_the_numbers(llm, length, max_new_tokens, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        llm.generate([random_ids(length, seed=1)], max_new_tokens=max_new_tokens)


def test_the_context_fits_exactly(llm):
    with one_thread():
        out = llm.generate([random_ids(CONTEXT - 2, seed=2)], max_new_tokens=2)
    assert out[0].prompt_tokens == CONTEXT - 2 and out[0].truncated_tokens == 0


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_cuts_the_prompt_as_asked(llm, side):
    """A cut prompt generates what its kept tokens generate alone; prompts that fit are left as they are."""
    long, short = random_ids(301, seed=3), random_ids(17, seed=4)
    with one_thread():
        got = llm.generate([long, short], max_new_tokens=5, truncate_prompt=side)
        kept = long[-(CONTEXT - 5) :] if side == "left" else long[: CONTEXT - 5]
        want = llm.generate([kept, short], max_new_tokens=5)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [(g.prompt_tokens, g.truncated_tokens) for g in got] == [(CONTEXT - 5, 301 - (CONTEXT - 5)), (17, 0)]


def test_a_cache_beyond_the_memory_there_is_is_refused_on_a_cpu(llm, monkeypatch):
    monkeypatch.setattr(api, "host_available_bytes", lambda reserve: 1000)  # bytes
    message = (
        r"the KV cache of 2 sequences of up to 30 tokens \(prompt \+ max_new_tokens\) needs [0-9.]+ GiB of "
        r"memory, and 0\.0 GiB is available$"
    )
    with pytest.raises(CapacityError, match=message):
        llm.generate([random_ids(10, seed=5), random_ids(20, seed=6)], max_new_tokens=10)
    with pytest.raises(CapacityError, match="; the model's context is 256 tokens$"):
        llm.generate([random_ids(10, seed=5)], max_new_tokens=10**8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0, got nan"),
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0, got inf"),
        ({"top_p": float("nan")}, "top_p must be in (0, 1], got nan"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer, got 0"),
        ({"truncate_prompt": "middle"}, "truncate_prompt must be None, 'left' or 'right', got 'middle'"),
    ],
    ids=["nan-temperature", "inf-temperature", "nan-top-p", "zero-tokens", "bad-truncation"],
)
def test_sampling_values_are_checked(llm, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        llm.generate([random_ids(4, seed=7)], **kwargs)


def test_a_device_that_is_not_there_is_named(llm):
    path = llm.loaded.source
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'gpu'"):
        LLM(path, device="gpu")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        with pytest.raises(ValueError, match=f"device 'cuda:{count}' is not available: this machine has cuda:0"):
            LLM(path, device=f"cuda:{count}")
    else:
        with pytest.raises(
            ValueError, match=f"device 'cuda' is not available: .*\\(torch {re.escape(torch.__version__)}"
        ):
            LLM(path, device="cuda")
