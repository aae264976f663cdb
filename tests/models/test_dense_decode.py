"""Dense attention's decode step: the split-KV kernel path (Triton's interpreter on the CPU, float32) against the
SDPA path, for sequences of mixed lengths in any slots; and when the kernel path is taken at all."""

import pytest
import torch

from longsparse.cache import ContiguousKVCache
from longsparse.models.attention import DECODE_BLOCK, DenseAttention
from longsparse.models.batch import ForwardBatch
from tests.helpers import rel_err

H, HKV, D = 4, 2, 16


def _step(capacity: int, prefix_lens: list[int], slots: list[int], seed: int = 0):
    """A cache of 5 slots whose ``slots`` hold ``prefix_lens`` random keys, and one decode step's q, k, v."""
    gen = torch.Generator().manual_seed(seed)
    cache = ContiguousKVCache([3], 5, capacity, HKV, D, torch.float32, "cpu", block_size=DECODE_BLOCK)
    cache.keys[3].normal_(generator=gen)  # filler past each length must never be read
    cache.values[3].normal_(generator=gen)
    batch = ForwardBatch.decode(prefix_lens, "cpu", slots=slots, kv_cache=cache, gdn_states=None)
    n = len(slots)
    q, k, v = (
        torch.randn(n, H, D, generator=gen),
        torch.randn(n, HKV, D, generator=gen),
        torch.randn(n, HKV, D, generator=gen),
    )
    return cache, batch, q, k, v


def _reference(cache, batch, q):
    """float64 attention of each sequence over its cached keys (the new token's included)."""
    outs = []
    for n, slot in enumerate(batch.slots):
        L = batch.prefix_lens[n] + 1
        keys = cache.keys[3][slot, :, :L].double().repeat_interleave(H // HKV, dim=0)
        values = cache.values[3][slot, :, :L].double().repeat_interleave(H // HKV, dim=0)
        s = torch.einsum("hd,hsd->hs", q[n].double(), keys) * D**-0.5
        outs.append(torch.einsum("hs,hsd->hd", s.softmax(-1), values))
    return torch.stack(outs)


@pytest.mark.parametrize(
    "prefix_lens, slots", [([5, 130, 63], [2, 0, 3]), ([191], [4]), ([64, 127], [1, 2])], ids=["mixed", "one", "edges"]
)
def test_kernel_and_sdpa_paths_match_float64(prefix_lens, slots):
    cache, batch, q, k, v = _step(200, prefix_lens, slots)
    assert cache.capacity == 256  # rounded up to whole blocks
    got = DenseAttention(decode_kernel=True)(3, q, k, v, batch)
    want = _reference(cache, batch, q)  # after the call: the step's k, v are in the cache
    assert rel_err(got.double(), want) < 1e-5
    sdpa = DenseAttention(decode_kernel=False)(3, q, k, v, batch)
    assert rel_err(sdpa.double(), want) < 1e-5


def test_kernel_path_needs_a_resident_cache_of_whole_blocks():
    cache, batch, q, k, v = _step(200, [5], [0])
    cache.capacity = 200  # as a cache built without block_size would be
    with pytest.raises(ValueError, match="multiple of 64"):
        DenseAttention(decode_kernel=True)(3, q, k, v, batch)
    # automatic: SDPA wherever the cache does not fit the kernel, and on the CPU
    assert not DenseAttention()._use_kernel(q, cache)
    cache.capacity = 256
    assert not DenseAttention()._use_kernel(q, cache)


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", [(32, 2, 128), (16, 4, 256)], ids=["minicpm4", "qwen35"])
def test_kernel_path_on_the_gpu_in_bf16(geometry):
    """The automatic choice takes the kernel on a GPU; it matches float64 at thousands of keys, mixed lengths."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    h, hkv, d = geometry
    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = ContiguousKVCache([0], 4, 9000, hkv, d, torch.bfloat16, "cuda", block_size=DECODE_BLOCK)
    cache.keys[0].normal_(generator=gen)
    cache.values[0].normal_(generator=gen)
    batch = ForwardBatch.decode([8999, 17, 4160], "cuda", slots=[3, 0, 1], kv_cache=cache, gdn_states=None)
    q = torch.randn(3, h, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(3, hkv, d, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    backend = DenseAttention()
    assert backend._use_kernel(q, cache)
    got = backend(0, q, k, v, batch).double()
    want = []
    for n, slot in enumerate(batch.slots):
        L = batch.prefix_lens[n] + 1
        keys, values = (
            t[slot, :, :L].double().repeat_interleave(h // hkv, dim=0) for t in (cache.keys[0], cache.values[0])
        )
        s = torch.einsum("hd,hsd->hs", q[n].double(), keys) * d**-0.5
        want.append(torch.einsum("hs,hsd->hd", s.softmax(-1), values))
    assert rel_err(got, torch.stack(want)) < 2e-2
