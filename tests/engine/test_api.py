"""``LLM.generate`` on tiny random checkpoints: transformers' greedy tokens, batching, stop strings, streaming,
end-of-sequence handling, sampling seeds, stats and input errors."""

import json

import pytest
import torch

from longsparse import LLM
from tests.tiny_models import EOS, build, random_ids, save, write_tokenizer

CHAT_TEMPLATE = (
    "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}{% if add_generation_prompt %}w3{% endif %}"
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case -> (transformers model, checkpoint folder with a tokenizer)."""
    out = {}
    for case in ("llama-gqa-bias", "qwen35"):
        hf = build(case, seed=11, eos_token_id=EOS, bos_token_id=None)
        path = save(hf, tmp_path_factory.mktemp(case))
        write_tokenizer(path, CHAT_TEMPLATE)
        out[case] = (hf, path)
    return out


@pytest.fixture(scope="module")
def llms(checkpoints):
    return {case: LLM(path) for case, (_, path) in checkpoints.items()}


def hf_greedy(hf, ids, n):
    x = torch.tensor([ids])
    with torch.no_grad():  # an explicit mask: generate would otherwise mask prompt tokens equal to pad_token_id
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=EOS)
    tokens = out[0, len(ids) :].tolist()
    return tokens[:-1] if tokens and tokens[-1] == EOS else tokens


@pytest.mark.parametrize("case", ["llama-gqa-bias", "qwen35"])
def test_greedy_tokens_match_transformers_generate(checkpoints, llms, case):
    hf, _ = checkpoints[case]
    prompts = [random_ids(n, seed=30 + n) for n in (7, 19, 66)]
    results = llms[case].generate(prompts, max_new_tokens=10)
    for prompt, result in zip(prompts, results):
        assert result.token_ids == hf_greedy(hf, prompt, 10)
        assert result.prompt_tokens == len(prompt)
        assert result.finish_reason == ("length" if len(result.token_ids) == 10 else "eos")


def test_batched_generation_equals_one_prompt_at_a_time(llms):
    llm = llms["qwen35"]
    prompts = [random_ids(n, seed=40 + n) for n in (5, 23, 12, 1)]
    batched = llm.generate(prompts, max_new_tokens=6)
    for prompt, result in zip(prompts, batched):
        assert llm.generate([prompt], max_new_tokens=6)[0].token_ids == result.token_ids


def test_small_prefill_groups_give_the_same_tokens(checkpoints, llms):
    prompts = [random_ids(n, seed=50 + n) for n in (9, 14, 3)]
    grouped = LLM(checkpoints["llama-gqa-bias"][1], max_prefill_tokens=10)
    assert [r.token_ids for r in grouped.generate(prompts, max_new_tokens=4)] == [
        r.token_ids for r in llms["llama-gqa-bias"].generate(prompts, max_new_tokens=4)
    ]


def test_text_prompts_stop_strings_and_streaming(llms):
    llm = llms["llama-gqa-bias"]
    prompt = "w3 w14 w15 w92 w65"
    full = llm.generate(prompt, max_new_tokens=8)[0]
    assert full.text == " ".join(f"w{t}" for t in full.token_ids)
    words = full.text.split()
    stop = " " + words[3]
    pieces = []
    result = llm.generate(prompt, max_new_tokens=8, stop=[stop], stream=lambda i, s: pieces.append((i, s)))[0]
    assert result.finish_reason == "stop"
    assert result.text == full.text[: full.text.index(stop)]
    assert "".join(p for _, p in pieces) == result.text
    assert {i for i, _ in pieces} == {0}
    assert len(pieces) > 1  # streamed as it went, not in one piece at the end


def test_end_of_sequence_token_ends_a_sequence_without_being_emitted(tmp_path, checkpoints, llms):
    hf, path = checkpoints["llama-gqa-bias"]
    prompt = random_ids(9, seed=60)
    first_two = llms["llama-gqa-bias"].generate([prompt], max_new_tokens=2)[0].token_ids
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, first_two[1]]}))
    try:
        result = LLM(path).generate([prompt], max_new_tokens=5)[0]
    finally:
        (path / "generation_config.json").unlink()
    assert result.token_ids == first_two[:1]
    assert result.finish_reason == "eos"


def test_a_sequence_finishing_early_leaves_the_others_unchanged(checkpoints, llms):
    """The middle prompt ends at once (its first token made end-of-sequence); the other two then decode from cache
    slots 0 and 2, a gap in between, and must give what they give alone."""
    _, path = checkpoints["qwen35"]
    prompts = [random_ids(n, seed=90 + n) for n in (8, 15, 21)]
    first = llms["qwen35"].generate([prompts[1]], max_new_tokens=1)[0].token_ids[0]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, first]}))
    try:
        llm = LLM(path)
    finally:
        (path / "generation_config.json").unlink()
    batched = llm.generate(prompts, max_new_tokens=6)
    assert batched[1].token_ids == [] and batched[1].finish_reason == "eos"
    for i in (0, 2):
        assert batched[i].token_ids == llm.generate([prompts[i]], max_new_tokens=6)[0].token_ids


def test_seeded_sampling(llms):
    llm = llms["qwen35"]
    prompt = [random_ids(6, seed=70)]
    a, b, c = (llm.generate(prompt, 16, temperature=1.0, seed=s)[0].token_ids for s in (3, 3, 4))
    assert a == b
    assert a != c


def test_chat_template_wraps_the_prompt(llms):
    assert llms["qwen35"].encode("w5 w6", chat=True) == [1, 5, 6, 2, 3]


def test_stats(llms):
    llm = llms["qwen35"]
    prompts = [random_ids(n, seed=80 + n) for n in (4, 10)]
    results = llm.generate(prompts, max_new_tokens=5)
    stats = llm.last_stats
    assert stats.prompt_tokens == 14
    assert stats.generated_tokens == sum(len(r.token_ids) for r in results)
    assert stats.decode_tokens == sum(len(r.token_ids) + (r.finish_reason == "eos") - 1 for r in results)
    # 10 + 5 tokens per slot, rounded up to whole 64-token blocks (dense decode's split-KV kernel reads blocks)
    capacity, attention_layers, kv_heads, head_dim = 64, 2, 2, 16
    assert stats.kv_bytes.host == attention_layers * 2 * len(prompts) * kv_heads * capacity * head_dim * 4
    assert stats.kv_bytes.gpu == 0
    assert stats.state_bytes.host > 0
    line = stats.summary()
    assert stats.decode_path == "eager"
    # only what applies: the cache is in host memory, the GDN layers ran dense, nothing was offloaded
    for part in ("prefill 14 tok", "tok/s, eager)", "KV cache 64.0 KiB host", "GDN state ", "attention dense"):
        assert part in line
    for part in ("GPU", "keep ratio", "hit rate", "n/a", "nan"):
        assert part not in line


@pytest.mark.parametrize(
    "prompts, kwargs, error, message",
    [
        ([], {}, ValueError, "at least one prompt"),
        ([[]], {}, ValueError, "at least one token"),
        ([[5, 101]], {}, ValueError, r"must lie in \[0, 101\)"),
        ([5, 6], {}, ValueError, "put a single token-id prompt in a list"),
        ([[5]], dict(max_new_tokens=0), ValueError, "max_new_tokens must be a positive integer"),
        ([[5]], dict(chat=True), ValueError, "chat=True needs text prompts"),
        ([[5]], dict(top_p=0.0), ValueError, "top_p must be in"),
    ],
    ids=["no-prompts", "empty-prompt", "token-out-of-range", "flat-ids", "zero-new-tokens", "chat-with-ids", "top-p"],
)
def test_bad_requests(llms, prompts, kwargs, error, message):
    with pytest.raises(error, match=message):
        llms["qwen35"].generate(prompts, **kwargs)


def test_text_and_stop_strings_need_a_tokenizer(tmp_path):
    llm = LLM(save(build("llama-gqa-bias", seed=12), tmp_path / "no-tokenizer"))
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("w1 w2")
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        llm.generate([[1, 2]], stop="x")
    assert llm.generate([[1, 2]], max_new_tokens=2)[0].text == ""
