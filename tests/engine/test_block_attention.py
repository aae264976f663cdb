"""The decode pipeline on whole models (CPU, torch references): offloading changes nothing but where blocks live —
Sparse equals Sparse† and SparDA with and without prefetch equals SparDA†, token for token and logit for logit —
block-sparse attention with a budget covering every block equals dense attention, and in a hybrid model the
Forecast of one attention layer announces the next attention layer's blocks, whose copy is issued before the GDN
layers between them run (with prefetch) or at that layer (without)."""

import pytest
import torch

from longsparse.cache import BlockKVCache, InlineStreams
from longsparse.cache.streams import TRANSFER
from longsparse.engine import ModelRunner, allocate_caches, allocate_compressed_keys
from longsparse.engine.decode_modes import build_cache, prepare_model
from longsparse.models.config import decoder_config_from_hf, hybrid_config_from_hf
from longsparse.models.forecast import ForecastProjections
from longsparse.models.hybrid import Qwen35ForCausalLM
from longsparse.models.llama import LlamaForCausalLM
from tests.helpers import EVERY_BLOCK_SPARSE, SMALL_BLOCK_SPARSE, one_thread, rel_err
from tests.tiny_models import TINY, TINY_GDN, randomize

CFG = SMALL_BLOCK_SPARSE
EVERY_BLOCK = EVERY_BLOCK_SPARSE


class LoggedStreams(InlineStreams):
    """CPU streams that note in ``log`` every piece of work enqueued on the transfer queue."""

    def __init__(self, log: list[str]):
        self.log = log

    def run(self, queue, work):
        if queue == TRANSFER:
            self.log.append("copy")
        super().run(queue, work)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def llama():
    config = decoder_config_from_hf({**TINY, "num_hidden_layers": 3, "max_position_embeddings": 4096},
                                    "LlamaForCausalLM")  # fmt: skip
    return randomize(LlamaForCausalLM(config).eval(), 41)


@pytest.fixture(scope="module")
def hybrid():
    config = hybrid_config_from_hf({**TINY, **TINY_GDN, "max_position_embeddings": 4096}, "Qwen3_5ForCausalLM")
    return randomize(Qwen35ForCausalLM(config).eval(), 42)


def decode_run(model, mode, prompts, steps, cfg=CFG, seed=5, log=None):
    """Greedy decode of ``prompts`` in ``mode``: ``(logits [steps + 1, N, vocab], tokens [steps + 1, N], cache)``.
    ``log``: a list that receives the cache's prefetch calls and transfer work (an offloaded mode)."""
    prepare_model(model, mode, cfg, forecast=ForecastProjections.random(model.config, seed=seed))
    capacity = max(map(len, prompts)) + steps + 1
    streams = LoggedStreams(log) if log is not None else None
    cache = build_cache(model.config, mode, len(prompts), capacity, torch.float32, "cpu", cfg, check_memory=False,
                        streams=streams)  # fmt: skip
    if log is not None:
        prefetch = cache.prefetch
        cache.prefetch = lambda layer, batch, ids: (log.append(f"prefetch {layer}"), prefetch(layer, batch, ids))[1]
    _, states = allocate_caches(model.config, len(prompts), capacity, torch.float32, "cpu", kv_cache=False)
    caches = dict(kv_cache=cache, gdn_states=states, compressed_keys=allocate_compressed_keys(model, len(prompts),
                                                                                              capacity))  # fmt: skip
    runner = ModelRunner(model)
    out = runner.prefill(prompts, **caches)
    logits, tokens = [out.logits], [out.logits.argmax(-1)]
    lens = [len(p) for p in prompts]
    for _ in range(steps):
        out = runner.decode(tokens[-1].tolist(), prefix_lens=lens, slots=list(range(len(prompts))), **caches)
        logits.append(out.logits)
        tokens.append(out.logits.argmax(-1))
        lens = [n + 1 for n in lens]
    return torch.stack(logits), torch.stack(tokens), cache


def prompts_of(lengths, vocab=TINY["vocab_size"]):
    return [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in lengths]


PROMPTS = prompts_of([100, 77, 131])  # 131 >= dense_len: its prefill selects blocks too


@pytest.mark.parametrize(
    "resident, offloaded", [("sparse_gpu", "sparse_offload"), ("sparda_gpu", "sparda_noprefetch"),
                            ("sparda_gpu", "sparda")],
    ids=["Sparse-vs-Sparse-dagger", "SparDA-noprefetch-vs-dagger", "SparDA-vs-dagger"],
)  # fmt: skip
def test_offloaded_decode_equals_gpu_resident_decode(llama, resident, offloaded):
    want_logits, want_tokens, _ = decode_run(llama, resident, PROMPTS, steps=100)
    logits, tokens, cache = decode_run(llama, offloaded, PROMPTS, steps=100)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(logits, want_logits)  # same selection, same blocks, same kernels: bit for bit
    stats = cache.transfer_stats()
    assert stats["overflow"] == 0 and stats["misses"] > 50 and 0 < stats["hit_rate"] < 1


def test_a_budget_covering_every_block_is_dense_attention(llama):
    dense, _, _ = decode_run(llama, "dense_gpu", PROMPTS, steps=20)
    for mode in ("sparse_offload", "sparda"):
        sparse, _, _ = decode_run(llama, mode, PROMPTS, steps=20, cfg=EVERY_BLOCK)
        assert rel_err(sparse, dense) < 1e-5, mode


@pytest.mark.parametrize("mode, copy_at", [("sparda", 4), ("sparda_noprefetch", 6)], ids=["prefetch", "no-prefetch"])
def test_hybrid_forecast_plans_the_next_attention_layer_across_gdn_layers(hybrid, mode, copy_at):
    """Qwen3.5-style layers GDN, attention 1, GDN, attention 3: layer 1's Forecast announces layer 3's blocks, whose
    copy is issued at once with prefetch (before the GDN layer 2 runs) or when layer 3 attends without; the offloaded
    decode still equals the GPU-resident one."""
    log = []
    order = [hybrid.model.layers[i].register_forward_pre_hook(lambda m, a, i=i: log.append(f"layer {i}"))
             for i in range(4)]  # fmt: skip
    try:
        want, want_tokens, _ = decode_run(hybrid, "sparda_gpu", prompts_of([90, 140]), steps=40)
        del log[:]
        got, tokens, cache = decode_run(hybrid, mode, prompts_of([90, 140]), steps=40, log=log)
    finally:
        for h in order:
            h.remove()
    assert isinstance(cache, BlockKVCache) and cache.layout.offloaded == (3,)
    step = log[log.index("layer 0", 1) :]  # the first decode step (after the prefill's pass); no block fills in it
    layers = ["layer 0", "layer 1", "prefetch 1", "prefetch 3", "layer 2", "layer 3"]
    assert step[:7] == layers[:copy_at] + ["copy"] + layers[copy_at:]
    assert torch.equal(tokens, want_tokens) and torch.equal(got, want)


def test_sparda_without_a_forecast_adapter_is_refused(llama):
    with pytest.raises(ValueError, match="attention mode 'sparda' needs a Forecast adapter"):
        prepare_model(llama, "sparda", CFG, forecast=None)


def test_chunked_prefill_is_refused(llama):
    prepare_model(llama, "sparse_offload", CFG)
    cache = build_cache(llama.config, "sparse_offload", 1, 64, torch.float32, "cpu", CFG, check_memory=False)
    caches = dict(kv_cache=cache, compressed_keys=allocate_compressed_keys(llama, 1, 64))
    runner = ModelRunner(llama)
    runner.prefill([[1, 2, 3]], **caches)
    with pytest.raises(NotImplementedError, match="fresh prompts only"):
        runner.prefill([[4, 5]], prefix_lens=[3], **caches)
