"""On a CUDA GPU: pinned host memory round-trips bit for bit through the prefill write-back, the UVA copy kernel and
the slot cache; and with real streams, copies delayed or readers delayed on purpose, no attention reads a stale
block — while the same run with a wait of the protocol dropped does."""

import pytest
import torch

from longsparse.cache import BlockKVCache, BlockLayout, CacheStep, HostBuffer
from longsparse.cache.streams import COMPUTE, TRANSFER, CudaStreams
from longsparse.ops.sparse_attn import MINICPM4
from longsparse.ops.transfer import copy_rows
from tests.cache.driver import decode, prefill
from tests.helpers import SMALL_BLOCK_SPARSE

pytestmark = pytest.mark.gpu

CFG = SMALL_BLOCK_SPARSE


def special_bf16(*shape, seed):
    """Random bf16 with NaNs of several payloads, infinities, signed zeros and subnormals mixed in."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bits = torch.randint(-(2**15), 2**15, shape, generator=gen, device="cuda", dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16)
    x.view(-1)[:6] = torch.tensor([0x7FC1, 0x7F81, -32767, 0x7F80, -32768, 0x0001], dtype=torch.int16,
                                  device="cuda").view(torch.bfloat16)  # fmt: skip
    return x


def bits(x):
    return x.contiguous().view(torch.int16) if x.dtype == torch.bfloat16 else x.contiguous().view(torch.uint8)


@pytest.mark.parametrize("ctas", [1, 16, 132])
def test_uva_copy_round_trips_bits_gpu_to_pinned_to_gpu(ctas):
    rows = special_bf16(300, 2 * 64 * 128, seed=ctas)
    host = HostBuffer().view(300 * rows.shape[1] * 2).view(torch.bfloat16).view(300, -1)
    assert host.is_pinned()
    order = torch.randperm(300, device="cuda")
    copy_rows(rows, host, order, torch.arange(300, device="cuda"), num_ctas=ctas)  # GPU -> pinned (UVA stores)
    torch.cuda.synchronize()
    assert torch.equal(bits(host), bits(rows[order].cpu()))
    back = torch.zeros_like(rows)
    count = torch.tensor([250], dtype=torch.int32, device="cuda")
    copy_rows(host, back, torch.arange(300, device="cuda"), order, count, num_ctas=ctas)  # pinned -> GPU (UVA loads)
    torch.cuda.synchronize()
    assert torch.equal(bits(back[order[:250]]), bits(rows[order[:250]]))
    assert not back[order[250:]].view(torch.int16).any()  # past the count: untouched


def test_prefill_write_back_and_slot_copies_keep_every_bit():
    layout = BlockLayout(MINICPM4, (0, 1), (1,), 2, 12000, 2, 128, torch.bfloat16)
    cache = BlockKVCache(layout, "cuda", prefetch=True)
    T = 9001
    k, v = special_bf16(T, 2, 128, seed=1), special_bf16(T, 2, 128, seed=2)
    prompt = CacheStep.prefill([T], "cuda", slots=[1])
    cache.begin_step(prompt)
    for layer in (0, 1):
        cache.store(layer, prompt, k, v)
    cache.end_step(prompt)
    torch.cuda.synchronize()
    host = cache._host_blocks()[1, 0]  # [Hkv, NB, 2, block, d] of the offloaded layer 1
    full = T // 64
    for h in range(2):
        want = torch.stack((k[: full * 64, h], v[: full * 64, h])).view(2, full, 64, 128).transpose(0, 1)
        assert torch.equal(bits(host[h, 1:full]), bits(want[1:].cpu()))  # block 0 is an init block: GPU only
    keys, values = cache.gather(1, [1], T)
    assert torch.equal(bits(keys[0].transpose(0, 1)), bits(k)) and torch.equal(bits(values[0].transpose(0, 1)), bits(v))
    # the slot cache: select some far blocks and read them back from their slots
    step = CacheStep.decode([T], "cuda", slots=[1])
    cache.begin_step(step)
    kn, vn = special_bf16(1, 2, 128, seed=3), special_bf16(1, 2, 128, seed=4)
    cache.store(0, step, kn, vn)
    cache.store(1, step, kn, vn)
    sel = torch.full((1, 2, MINICPM4.decode_width()), -1, dtype=torch.int32)
    blocks = [0, 3, 17, 50, 99, *range(108, 141)]  # init, three dynamic, the window and the tail (block 140)
    sel[0, :, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    k_slots, v_slots, table = cache.block_slots(1, step, sel.cuda(), 64)
    torch.cuda.synchronize()
    for h in range(2):
        for e, b in enumerate(blocks[1:4], start=1):
            slot = int(table[0, h, e])
            assert torch.equal(bits(k_slots[slot]), bits(k[b * 64 : (b + 1) * 64, h]))
            assert torch.equal(bits(v_slots[slot]), bits(v[b * 64 : (b + 1) * 64, h]))
    cache.release(1)
    cache.end_step(step)


class AdversarialStreams(CudaStreams):
    """Real CUDA streams with sleeps before transfer work (late copies) or compute work (late readers), and
    optionally some waits dropped."""

    def __init__(self, device, *, delay: str, cycles: int = 2_000_000, drop: tuple[str, ...] = ()):
        super().__init__(device)
        self.delay, self.cycles, self.drop = delay, cycles, drop

    def run(self, queue, work):
        def delayed():
            if queue == self.delay:
                torch.cuda._sleep(self.cycles)
            work()

        super().run(queue, delayed)

    def wait(self, queue, event):
        if not event.startswith(self.drop):
            super().wait(queue, event)


def adversarial_run(delay, drop=(), cycles=2_000_000):
    layout = BlockLayout(CFG, (0, 2, 5), (2, 5), 3, 520, 2, 8, torch.float32)
    streams = AdversarialStreams("cuda", delay=delay, drop=drop, cycles=cycles)
    cache = BlockKVCache(layout, "cuda", prefetch=True, streams=streams)
    lengths = {0: 331, 2: 258}
    prefill(cache, lengths)
    attend = decode(cache, lengths, 16, forecast=True, seed=1)
    torch.cuda.synchronize()
    return cache, attend


@pytest.mark.parametrize("delay", [TRANSFER, COMPUTE], ids=["late-copies", "late-readers"])
def test_no_stale_block_with_real_streams_and_delays(delay):
    cache, attend = adversarial_run(delay)
    assert int(attend.stale) == 0 and int(attend.checked) > 10_000
    assert cache.transfer_stats()["misses"] > 0.8 * cache.transfer_stats()["dynamic"]


@pytest.mark.parametrize(
    "delay, drop",
    [(TRANSFER, ("copied:",)), (COMPUTE, ("planned:", "read:"))],
    ids=["reader-skips-copy-wait", "copy-skips-reader-wait"],
)
def test_real_streams_catch_a_dropped_wait(delay, drop):
    # The delay must outlast the host's work between issuing a copy and its reader (the test selector runs Python
    # loops): at 2M cycles (~1 ms) the H200 finished the late copies before their unsynchronised readers ran.
    _, attend = adversarial_run(delay, drop, cycles=50_000_000)
    assert int(attend.stale) > 0
