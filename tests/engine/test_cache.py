"""The contiguous KV cache and the GDN state store: writes land where asked, reads return them, bytes add up."""

import pytest
import torch

from longsparse.engine import CacheBytes, ContiguousKVCache, GDNStates, allocate_caches
from longsparse.models.config import decoder_config_from_hf, hybrid_config_from_hf
from tests.tiny_models import TINY, TINY_GDN


def test_store_then_gather_returns_each_slots_tokens():
    cache = ContiguousKVCache([3, 5], num_slots=4, capacity=10, num_kv_heads=2, head_dim=3, dtype=torch.float32,
                              device="cpu")  # fmt: skip
    k = torch.randn(7, 2, 3)
    v = torch.randn(7, 2, 3)
    slots = torch.tensor([2, 2, 2, 0, 0, 3, 3])
    positions = torch.tensor([0, 1, 2, 0, 1, 0, 1])
    cache.store(5, slots, positions, k, v)
    keys, values = cache.gather(5, [2, 0, 3], 3)  # not a contiguous range: a copy
    assert keys.shape == (3, 2, 3, 3)
    torch.testing.assert_close(keys[0].transpose(0, 1), k[:3])
    torch.testing.assert_close(values[1, :, :2].transpose(0, 1), v[3:5])
    assert torch.equal(keys[1, :, 2], torch.zeros(2, 3))  # unwritten: finite filler
    view, _ = cache.gather(5, [2, 3], 2)  # a contiguous range: a view
    assert view.data_ptr() == cache.keys[5][2].data_ptr()
    assert torch.equal(cache.keys[3], torch.zeros_like(cache.keys[3]))


def test_bytes_are_counted_by_location():
    cache = ContiguousKVCache([0, 1, 2], 2, 16, 3, 4, torch.float32, "cpu")
    assert cache.nbytes() == CacheBytes(gpu=0, host=3 * 2 * (2 * 3 * 16 * 4) * 4)
    assert CacheBytes(1, 2) + CacheBytes(3, 4) == CacheBytes(4, 6)


@pytest.mark.gpu
def test_bytes_on_the_gpu_are_counted_as_gpu():
    cache = ContiguousKVCache([0], 1, 64, 2, 8, torch.bfloat16, "cuda")
    assert cache.nbytes() == CacheBytes(gpu=2 * 64 * 2 * 8 * 2, host=0)


def test_gdn_states_reset_only_the_given_slots():
    states = GDNStates([1], 3, conv_dim=5, conv_kernel=4, num_v_heads=2, head_k_dim=3, head_v_dim=4,
                       dtype=torch.bfloat16, device="cpu")  # fmt: skip
    assert states.conv[1].shape == (3, 5, 3) and states.conv[1].dtype == torch.bfloat16
    assert states.recurrent[1].shape == (3, 2, 3, 4) and states.recurrent[1].dtype == torch.float32
    states.conv[1].fill_(1)
    states.recurrent[1].fill_(2)
    states.reset([0, 2])
    assert states.conv[1][[0, 2]].abs().sum() == 0 and states.recurrent[1][[0, 2]].abs().sum() == 0
    assert (states.conv[1][1] == 1).all() and (states.recurrent[1][1] == 2).all()
    assert states.nbytes().host == 3 * 5 * 3 * 2 + 3 * 2 * 3 * 4 * 4


def test_allocation_follows_the_layer_layout():
    llama = decoder_config_from_hf(TINY, "LlamaForCausalLM")
    kv, states = allocate_caches(llama, 2, 8, torch.float32, "cpu")
    assert sorted(kv.keys) == [0, 1] and states is None
    hybrid = hybrid_config_from_hf({**TINY, **TINY_GDN}, "Qwen3_5ForCausalLM")
    kv, states = allocate_caches(hybrid, 2, 8, torch.float32, "cpu")
    assert sorted(kv.keys) == [1, 3] and sorted(states.conv) == [0, 2]
