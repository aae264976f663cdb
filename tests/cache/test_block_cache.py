"""The block KV cache on its own: prompts and appended tokens read back bit for bit from wherever their blocks live
(GPU rows, the window ring, host memory), tables point at the right rows, bytes add up, misuse is refused."""

import pytest
import torch

from longsparse.cache import BlockKVCache, BlockLayout, CacheBytes, CacheStep, HostBuffer, InlineStreams
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.cache.driver import HostileSelector, decode, decode_batch, keys_for, prefill
from tests.helpers import SMALL_BLOCK_SPARSE, one_thread

CFG = SMALL_BLOCK_SPARSE
TWO_INIT = SparseAttentionConfig(block_size=16, init_blocks=2, window=16, topk=7, kernel_size=16, kernel_stride=8,
                                 dense_len=0)  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def make(cfg=CFG, offloaded=(2, 5), seqs=3, capacity=300, dtype=torch.float32, host_buffer=None):
    layout = BlockLayout(cfg, (0, 2, 5), offloaded, seqs, capacity, 2, 8, dtype)
    return BlockKVCache(layout, "cpu", streams=InlineStreams(), host_buffer=host_buffer, use_kernel=False)


def assert_holds(cache, lengths):
    lay = cache.layout
    for layer in lay.layers:
        for s, n in lengths.items():
            k, v = cache.gather(layer, [s], n)
            want = keys_for(layer, s, torch.arange(n), lay.num_kv_heads, lay.head_dim, lay.block_size).to(lay.dtype)
            assert torch.equal(k[0].transpose(0, 1), want), (layer, s)
            assert torch.equal(v[0].transpose(0, 1), -want), (layer, s)


@pytest.mark.parametrize("cfg", [CFG, TWO_INIT], ids=["init1-window2", "init2-window1"])
@pytest.mark.parametrize("lengths", [{0: 1, 1: 15, 2: 16}, {0: 17, 2: 63}, {1: 130, 2: 299}],
                         ids=["T1-T15-T16", "T17-T63", "T130-T299"])  # fmt: skip
def test_prompts_read_back_from_gpu_rows_ring_and_host(cfg, lengths):
    cache = make(cfg)
    prefill(cache, lengths)
    assert_holds(cache, lengths)
    assert cache.lengths == [lengths.get(s, 0) for s in range(3)]


def test_tokens_appended_across_block_boundaries_read_back_after_write_back():
    cache = make()
    lengths = {0: 29, 2: 45}
    prefill(cache, lengths)
    decode(cache, lengths, 70, forecast=True)  # both cross several block boundaries and leave the window
    assert_holds(cache, lengths)


def test_write_back_stores_the_bits_of_a_filled_block_in_its_host_row():
    cache = make(dtype=torch.bfloat16)
    lengths = {1: 40}
    prefill(cache, lengths)
    decode(cache, lengths, 8, forecast=False)  # position 47 fills block 2
    lay = cache.layout
    for layer in lay.offloaded:
        for h in range(lay.num_kv_heads):
            row = cache._host[lay.host_row(layer, 1, h, 2)].view(2, 16, 8)
            want = keys_for(layer, 1, torch.arange(32, 48), 2, 8, 16)[:, h].to(torch.bfloat16)
            assert torch.equal(row[0].view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("announced", [False, True], ids=["planned-at-the-layer", "announced-by-prefetch"])
def test_tables_name_rows_that_hold_the_selected_blocks(announced):
    cache = make()
    lengths = {0: 200, 1: 150}
    prefill(cache, lengths)
    batch = decode_batch(cache, lengths)
    lay = cache.layout
    select = HostileSelector(cache, seed=3)
    cache.selection_log = []
    cache.begin_step(batch)
    for layer in lay.layers:
        sel = select(layer, batch)
        if announced:
            cache.prefetch(layer, batch, sel)
        k = torch.stack([keys_for(layer, s, torch.tensor([lengths[s]]), 2, 8, 16)[0] for s in (0, 1)])
        cache.store(layer, batch, k, -k)
        k_slots, v_slots, table = cache.block_slots(layer, batch, sel, 16)
        for n, s in enumerate((0, 1)):
            for h in range(2):
                for e in (sel[n, h] >= 0).nonzero().flatten().tolist():
                    want = keys_for(layer, s, torch.arange(int(sel[n, h, e]) * 16, int(sel[n, h, e]) * 16 + 16),
                                    2, 8, 16)[:, h]  # fmt: skip
                    rows = min(16, lengths[s] + 1 - int(sel[n, h, e]) * 16)  # the tail block is partly filled
                    assert torch.equal(k_slots[int(table[n, h, e])][:rows], want[:rows])
                    assert torch.equal(v_slots[int(table[n, h, e])][:rows], -want[:rows])
        cache.release(layer)
    cache.end_step(batch)
    assert [layer for layer, _ in cache.selection_log] == list(lay.layers)
    stats = cache.transfer_stats()
    assert stats["misses"] > 0 and stats["overflow"] == 0


def test_bytes_are_exactly_the_layouts():
    cache = make()
    lay = cache.layout
    assert cache.nbytes() == CacheBytes(gpu=0, host=lay.gpu_bytes() + lay.host_bytes())  # all on the CPU here


def test_host_buffer_is_reused_and_grown_only_when_too_small():
    buffer = HostBuffer(pin=False)
    a = make(host_buffer=buffer)
    first = buffer.nbytes
    assert first == a.layout.host_bytes()
    b = make(seqs=2, host_buffer=buffer)
    assert buffer.nbytes == first and b._host.data_ptr() == a._host.data_ptr()
    make(seqs=5, host_buffer=buffer)
    assert buffer.nbytes == 5 * first // 3


def test_store_takes_packed_prompts_and_decode_tokens():
    cache = make()
    lengths = {0: 40, 2: 33}
    prefill_batch = CacheStep.prefill(list(lengths.values()), "cpu", slots=list(lengths))
    cache.begin_step(prefill_batch)
    for layer in cache.layout.layers:
        k = torch.cat([keys_for(layer, s, torch.arange(n), 2, 8, 16) for s, n in lengths.items()])
        cache.store(layer, prefill_batch, k, -k)
    cache.end_step(prefill_batch)
    batch = decode_batch(cache, lengths)
    cache.begin_step(batch)
    for layer in cache.layout.layers:
        k = torch.stack([keys_for(layer, s, torch.tensor([n]), 2, 8, 16)[0] for s, n in lengths.items()])
        cache.store(layer, batch, k, -k)
    cache.end_step(batch)
    assert_holds(cache, {0: 41, 2: 34})


def test_a_prefill_after_cached_tokens_is_not_supported():
    cache = make()
    prefill(cache, {1: 4})
    batch = CacheStep.prefill([2], "cpu", prefix_lens=[4], slots=[1])
    with pytest.raises(NotImplementedError, match="fresh prompts only: slot 1 got a prefill after 4 cached tokens"):
        cache.store(0, batch, torch.zeros(2, 2, 8), torch.zeros(2, 2, 8))


def _prompt(slot: int, T: int) -> CacheStep:
    return CacheStep.prefill([T], "cpu", slots=[slot])


def _step(slot: int, position: int) -> CacheStep:
    return CacheStep.decode([position], "cpu", slots=[slot])


@pytest.mark.parametrize(
    "action, match",
    [
        (lambda c: c.store(2, _prompt(0, 301), torch.zeros(301, 2, 8), torch.zeros(301, 2, 8)), "capacity"),
        (lambda c: c.store(2, _prompt(3, 5), torch.zeros(5, 2, 8), torch.zeros(5, 2, 8)), "slot"),
        (lambda c: c.store(2, _step(0, 7), torch.zeros(1, 2, 8), torch.zeros(1, 2, 8)), "cannot append position 7"),
        (lambda c: c.block_slots(2, _step(0, 7), torch.zeros(1, 2, 5, dtype=torch.int32), 16), "selection must be"),
        (lambda c: c.prefetch(2, _step(0, 7), torch.zeros(2, 2, 8, dtype=torch.int32)), "selection must be"),
        (lambda c: c.block_slots(2, _step(0, 7), torch.zeros(1, 2, 8, dtype=torch.int32), 64), "block_size 64"),
    ],
    ids=["too-long", "bad-slot", "wrong-position", "selection-width", "selection-rows", "block-size"],
)  # fmt: skip
def test_misuse_is_refused(action, match):
    with pytest.raises(ValueError, match=match):
        action(make())


def test_reset_forgets_lengths_and_resident_blocks():
    cache = make()
    lengths = {0: 200}
    prefill(cache, lengths)
    decode(cache, lengths, 3, forecast=False)
    assert (cache._dynamic[:, 0:2] >= 0).any()
    cache.reset([0])
    assert cache.lengths[0] == 0 and (cache._dynamic[:, 0:2] == -1).all()


def test_num_ctas_must_be_positive():
    layout = BlockLayout(CFG, (0,), (0,), 1, 64, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="num_ctas"):
        BlockKVCache(layout, "cpu", num_ctas=0)
