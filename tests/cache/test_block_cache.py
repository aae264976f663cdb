"""The block KV cache on its own: prompts and appended tokens read back bit for bit from wherever their blocks live
(GPU rows, the window ring, host memory), tables point at the right rows, bytes add up, misuse is refused."""

import pytest
import torch

from longsparse.cache import BlockKVCache, BlockLayout, DecodeRows, HostBuffer, InlineStreams
from longsparse.engine import CacheBytes
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.cache.driver import HostileSelector, decode, keys_for, prefill

CFG = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=6, kernel_size=16, kernel_stride=8,
                            dense_len=64)  # fmt: skip
TWO_INIT = SparseAttentionConfig(block_size=16, init_blocks=2, window=16, topk=7, kernel_size=16, kernel_stride=8,
                                 dense_len=0)  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def test_tables_name_rows_that_hold_the_selected_blocks():
    cache = make()
    lengths = {0: 200, 1: 150}
    prefill(cache, lengths)
    rows = DecodeRows.build([0, 1], [200, 150], "cpu")
    lay = cache.layout
    select = HostileSelector(cache, seed=3)
    for layer in lay.layers:
        k = torch.stack([keys_for(layer, s, torch.tensor([lengths[s]]), 2, 8, 16)[0] for s in (0, 1)])
        cache.append(layer, rows, k, -k)
        sel = select(layer, rows)
        cache.plan(layer, sel, rows)
        view = cache.acquire(layer)
        for n, s in enumerate((0, 1)):
            for h in range(2):
                for e in (sel[n, h] >= 0).nonzero().flatten().tolist():
                    slot = view.k_slots[int(view.table[n, h, e])]
                    assert (
                        slot[0, 0].item()
                        == keys_for(layer, s, torch.tensor([int(sel[n, h, e]) * 16]), 2, 8, 16)[0, h, 0].item()
                    )
        cache.release(layer)


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


def test_the_generic_store_takes_prompts_and_single_tokens():
    a, b = make(), make()
    lengths = {0: 40, 2: 33}
    prefill(a, dict(lengths))
    for layer in b.layout.layers:
        k = torch.cat([keys_for(layer, s, torch.arange(n), 2, 8, 16) for s, n in lengths.items()])
        slots = torch.cat([torch.full((n,), s) for s, n in lengths.items()])
        pos = torch.cat([torch.arange(n) for n in lengths.values()])
        b.store(layer, slots, pos, k, -k)
    for layer in b.layout.layers:
        k = torch.stack([keys_for(layer, s, torch.tensor([n]), 2, 8, 16)[0] for s, n in lengths.items()])
        b.store(layer, torch.tensor([0, 2]), torch.tensor([40, 33]), k, -k)
    assert_holds(b, {0: 41, 2: 34})


@pytest.mark.parametrize(
    "action, match",
    [
        (lambda c: c.write_prefill(2, 0, torch.zeros(301, 2, 8), torch.zeros(301, 2, 8), torch.zeros(1, 2, 8)),
         "capacity"),
        (lambda c: c.write_prefill(2, 3, torch.zeros(5, 2, 8), torch.zeros(5, 2, 8), torch.zeros(1, 2, 8)), "slot"),
        (lambda c: c.append(2, DecodeRows.build([0], [7], "cpu"), torch.zeros(1, 2, 8), torch.zeros(1, 2, 8)),
         "cannot append position 7"),
        (lambda c: c.acquire(5), "no plan"),
        (lambda c: c.plan(2, torch.zeros(1, 2, 5, dtype=torch.int32), DecodeRows.build([0], [0], "cpu")),
         "selection must be"),
        (lambda c: c.store(0, torch.tensor([1, 1]), torch.tensor([4, 5]), torch.zeros(2, 2, 8), torch.zeros(2, 2, 8)),
         "fresh prompts or one token"),
    ],
    ids=["too-long", "bad-slot", "wrong-position", "acquire-unplanned", "selection-width", "chunked-store"],
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
