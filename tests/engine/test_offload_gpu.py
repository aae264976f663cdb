"""On a CUDA GPU with the Triton kernels and real streams: offloaded decode (SparDA with prefetch, Sparse) reproduces
the GPU-resident decode over 256 steps — same selections, same tokens, logits within bf16 tolerance — and a
4096-step soak at batch 8 holds GPU memory constant."""

import pytest
import torch

from longsparse import LLM
from longsparse.bench.decode import random_model
from longsparse.cache import CapacityError
from longsparse.engine import ModelRunner, allocate_compressed_keys
from longsparse.engine.decode_modes import build_cache, prepare_model
from longsparse.models.forecast import ForecastProjections
from longsparse.ops.sparse_attn import MINICPM4
from tests.helpers import rel_err
from tests.tiny_models import EOS, build, random_ids, save, write_tokenizer

pytestmark = pytest.mark.gpu

SMALL = dict(vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-5, tie_word_embeddings=False)  # fmt: skip


@pytest.fixture(scope="module")
def model():
    return random_model(SMALL, 16384, torch.device("cuda"), torch.bfloat16, seed=3)


def prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, SMALL["vocab_size"], (n,), generator=gen).tolist() for n in lengths]


def run(model, mode, token_ids, steps, forced=None):
    """Prefill ``token_ids`` (MiniCPM4 geometry: above dense_len, so the prefill selects blocks too), then ``steps``
    decode steps, greedy or fed ``forced [steps, N]``; returns (logits, tokens, selections, cache)."""
    forecast = ForecastProjections.random(model.config, seed=7).to("cuda", torch.bfloat16)
    prepare_model(model, mode, MINICPM4, forecast=forecast)
    capacity = max(map(len, token_ids)) + steps + 1
    cache = build_cache(model.config, mode, len(token_ids), capacity, torch.bfloat16, "cuda", MINICPM4)
    cache.selection_log = []
    caches = dict(kv_cache=cache, compressed_keys=allocate_compressed_keys(model, len(token_ids), capacity))
    runner = ModelRunner(model)
    out = runner.prefill(token_ids, **caches)
    lens = [len(t) for t in token_ids]
    tokens, logits = [out.logits.argmax(-1)], []
    for i in range(steps):
        feed = tokens[-1] if forced is None else forced[i]
        out = runner.decode(feed.tolist(), prefix_lens=lens, slots=list(range(len(lens))), gdn_states=None, **caches)
        logits.append(out.logits)
        tokens.append(out.logits.argmax(-1))
        lens = [n + 1 for n in lens]
    torch.cuda.synchronize()
    return torch.stack(logits), torch.stack(tokens), [s for _, s in cache.selection_log], cache


@pytest.mark.parametrize(
    "resident, offloaded", [("sparda_gpu", "sparda"), ("sparse_gpu", "sparse_offload")],
    ids=["SparDA-prefetch-vs-dagger", "Sparse-vs-dagger"],
)  # fmt: skip
def test_offloaded_decode_reproduces_resident_decode_over_256_steps(model, resident, offloaded):
    ids = prompts([8300, 9001, 10050, 12345])
    want_logits, want_tokens, want_sel, _ = run(model, resident, ids, 256)
    # fed the resident run's tokens, so that one flipped near-tie could not make the two runs diverge
    logits, tokens, sel, cache = run(model, offloaded, ids, 256, forced=want_tokens)
    assert len(sel) == len(want_sel) and all(torch.equal(a, b) for a, b in zip(sel, want_sel))
    assert torch.equal(tokens, want_tokens)
    assert rel_err(logits, want_logits) < 2e-3
    stats = cache.transfer_stats()
    assert stats["overflow"] == 0 and stats["misses"] > 0


def test_soak_4096_steps_at_batch_8_keeps_gpu_memory_constant():
    small = random_model({**SMALL, "num_hidden_layers": 3, "hidden_size": 512, "num_attention_heads": 8},
                         16384, torch.device("cuda"), torch.bfloat16, seed=4)  # fmt: skip
    prepare_model(small, "sparda", MINICPM4, forecast=ForecastProjections.random(small.config, seed=8).to(
        "cuda", torch.bfloat16))  # fmt: skip
    ids = prompts([8250 + 37 * i for i in range(8)], seed=1)
    steps = 4096
    capacity = max(map(len, ids)) + steps + 1
    cache = build_cache(small.config, "sparda", 8, capacity, torch.bfloat16, "cuda", MINICPM4)
    caches = dict(kv_cache=cache, compressed_keys=allocate_compressed_keys(small, 8, capacity))
    runner = ModelRunner(small)
    out = runner.prefill(ids, **caches)
    lens = [len(t) for t in ids]
    token = out.logits.argmax(-1)
    allocated, reserved = [], []
    for step in range(1, steps + 1):
        out = runner.decode(token.tolist(), prefix_lens=lens, slots=list(range(8)), gdn_states=None, **caches)
        token = out.logits.argmax(-1)
        lens = [n + 1 for n in lens]
        if step % 512 == 0:
            torch.cuda.synchronize()
            allocated.append(torch.cuda.memory_allocated())
            reserved.append(torch.cuda.memory_reserved())
    assert len(set(allocated)) == 1, allocated
    assert len(set(reserved[1:])) == 1, reserved
    assert torch.isfinite(out.logits).all()
    stats = cache.transfer_stats()
    assert stats["overflow"] == 0 and stats["misses"] > 0 and cache.lengths == lens


def test_llm_refuses_what_does_not_fit_instead_of_running_out_of_memory(tmp_path):
    path = save(build("llama-gqa-bias", seed=5, eos_token_id=EOS, bos_token_id=None), tmp_path / "tiny")
    write_tokenizer(path)
    prompt = random_ids(50, seed=1)
    with pytest.raises(CapacityError, match="GPU memory"):
        LLM(path).generate([prompt] * 64, max_new_tokens=50_000_000)
    llm = LLM(path, attention="sparse", offload="cpu")
    with pytest.raises(CapacityError, match="host memory"):
        llm.generate([prompt] * 64, max_new_tokens=50_000_000)
    assert llm.generate([prompt], max_new_tokens=4)[0].token_ids
