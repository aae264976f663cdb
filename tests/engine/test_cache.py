"""The contiguous KV cache, the compressed-key store and the GDN state store: writes land where asked, reads (dense
and block-sparse) return them, bytes add up."""

import pytest
import torch

from longsparse.cache import CompressedKeys
from longsparse.engine import CacheBytes, ContiguousKVCache, GDNStates, allocate_caches
from longsparse.models.batch import ForwardBatch
from longsparse.models.config import decoder_config_from_hf, hybrid_config_from_hf
from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.ops.sparse_attn.naive import compress_keys_ref
from tests.tiny_models import TINY, TINY_GDN


def test_store_then_gather_returns_each_slots_tokens():
    cache = ContiguousKVCache([3, 5], num_slots=4, capacity=10, num_kv_heads=2, head_dim=3, dtype=torch.float32,
                              device="cpu")  # fmt: skip
    k = torch.randn(7, 2, 3)
    v = torch.randn(7, 2, 3)
    batch = ForwardBatch.prefill([3, 2, 2], "cpu", slots=[2, 0, 3], kv_cache=cache)  # slots 2,2,2,0,0,3,3
    assert batch.positions.tolist() == [0, 1, 2, 0, 1, 0, 1]
    cache.store(5, batch, k, v)
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


def test_block_slots_are_views_of_the_cache_addressed_by_slot():
    """Slots 2 and 0 of a 4-slot cache (capacity 48 = 3 blocks of 16): every listed block's slot holds exactly that
    sequence's keys/values of that block and head; −1 stays −1; nothing is copied."""
    cache = ContiguousKVCache([7], num_slots=4, capacity=48, num_kv_heads=2, head_dim=3, dtype=torch.float32,
                              device="cpu")  # fmt: skip
    cache.keys[7].copy_(torch.randn(cache.keys[7].shape))
    cache.values[7].copy_(torch.randn(cache.values[7].shape))
    ids = torch.tensor([[[2, 0, -1], [1, -1, -1]], [[0, 1, 2], [2, 1, 0]]], dtype=torch.int32)  # [N=2, Hkv=2, S=3]
    batch = ForwardBatch.decode([40, 47], "cpu", slots=[2, 0], kv_cache=cache, gdn_states=None)
    slot_index = batch.slot_index
    cache.selection_log = []
    k_slots, v_slots, table = cache.block_slots(7, batch, ids, 16)
    assert len(cache.selection_log) == 1 and cache.selection_log[0][0] == 7
    assert torch.equal(cache.selection_log[0][1], ids) and cache.selection_log[0][1] is not ids  # a copy
    assert k_slots.shape == (4 * 2 * 3, 16, 3) and k_slots.data_ptr() == cache.keys[7].data_ptr()
    assert v_slots.data_ptr() == cache.values[7].data_ptr() and table.dtype == torch.int32
    assert torch.equal(table < 0, ids < 0)
    for n, s in enumerate(slot_index.tolist()):
        for h in range(2):
            for e in range(3):
                b = int(ids[n, h, e])
                if b >= 0:
                    assert torch.equal(k_slots[table[n, h, e]], cache.keys[7][s, h, 16 * b : 16 * b + 16])
                    assert torch.equal(v_slots[table[n, h, e]], cache.values[7][s, h, 16 * b : 16 * b + 16])
    cache.prefetch(7, batch, ids)  # resident: no-ops that must accept the calls
    cache.release(7)


def test_block_slots_need_a_capacity_in_whole_blocks():
    cache = ContiguousKVCache([0], 1, 40, 1, 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match="capacity \\(40\\) to be a multiple of the block size \\(16\\)"):
        batch = ForwardBatch.decode([5], "cpu", slots=[0], kv_cache=cache, gdn_states=None)
        cache.block_slots(0, batch, torch.zeros(1, 1, 1, dtype=torch.int32), 16)
    llama = decoder_config_from_hf(TINY, "LlamaForCausalLM")
    kv, _ = allocate_caches(llama, 2, 40, torch.float32, "cpu", block_size=16)
    assert kv.capacity == 48


def test_compressed_keys_prefill_write_and_bytes():
    cfg = SparseAttentionConfig(block_size=16, window=16, topk=2, kernel_size=8, kernel_stride=4, dense_len=0)
    store = CompressedKeys([1, 3], num_slots=2, capacity=50, num_kv_heads=2, head_dim=4, config=cfg,
                           dtype=torch.float32, device="cpu")  # fmt: skip
    assert store.capacity == cfg.num_compressed(50) == 11
    assert store.k_cmp[3].shape == (2, 11, 2, 4) and store.ring[3].shape == (2, 8, 2, 4)
    keys = torch.randn(21, 2, 4)
    k_cmp, _ = compress_keys_ref(keys[None], 8, 4)
    store.write_prefill(3, 1, k_cmp[0], keys)
    assert torch.equal(store.k_cmp[3][1, :4], k_cmp[0]) and (store.k_cmp[3][1, 4:] == 0).all()
    assert (store.k_cmp[3][0] == 0).all() and (store.k_cmp[1] == 0).all()
    for p in range(13, 21):  # the last kernel_size keys, position p in ring slot p % 8
        assert torch.equal(store.ring[3][1, p % 8], keys[p])
    assert store.nbytes() == CacheBytes(gpu=0, host=2 * (2 * 11 + 2 * 8) * 2 * 4 * 4)
    with pytest.raises(ValueError, match="do not fit"):
        store.write_prefill(3, 0, torch.zeros(12, 2, 4), torch.zeros(60, 2, 4))


def test_compressed_keys_only_for_block_sparse_layers(tmp_path):
    from longsparse.engine.cache import allocate_compressed_keys
    from longsparse.models import ExecutionModes, load_model
    from tests.tiny_models import build, save

    path = save(build("qwen35", seed=3), tmp_path)
    assert allocate_compressed_keys(load_model(path).model, 2, 64) is None
    cfg = SparseAttentionConfig(block_size=16, window=16, topk=2, kernel_size=8, kernel_stride=4)
    model = load_model(path, modes=ExecutionModes(attention={3: "sparse"}), sparse_attention_config=cfg).model
    store = allocate_compressed_keys(model, 2, 64)
    assert sorted(store.k_cmp) == [3] and store.config == cfg and store.k_cmp[3].shape == (2, 15, 2, 16)
