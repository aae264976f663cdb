"""The slot-reuse protocol under adversarial schedules: with every dynamic slot recycled nearly every step and the
transfer queue running as late or as early as CUDA would allow (or in random interleavings), no attention ever reads
a stale block — and the checks do catch stale reads once a wait of the protocol is dropped."""

import pytest
import torch

from longsparse.cache import BlockKVCache, BlockLayout
from tests.cache.driver import decode, keys_for, prefill
from tests.cache.stream_sim import SimulatedStreams
from tests.helpers import SMALL_BLOCK_SPARSE, one_thread

CFG = SMALL_BLOCK_SPARSE
LAYERS, OFFLOADED = (0, 2, 5), (2, 5)  # SparDA: the first attention layer stays on the GPU


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def run(policy, seed=0, drop=(), prefetch=True, forecast=True, steps=24):
    streams = SimulatedStreams(policy, seed=seed, drop_waits=drop)
    layout = BlockLayout(CFG, LAYERS, OFFLOADED, 3, 520, 2, 8, torch.float32)
    cache = BlockKVCache(layout, "cpu", prefetch=prefetch, streams=streams, use_kernel=False)
    lengths = {0: 331, 2: 258}  # odd lengths, slot 1 unused: the batch's slots are not consecutive
    prefill(cache, lengths)
    attend = decode(cache, lengths, steps, forecast=forecast, seed=seed)
    assert streams.queues["compute"] or streams.queues["transfer"]  # the host ran ahead: work is still deferred
    streams.drain()
    return cache, attend, lengths


SCHEDULES = [("compute_first", 0), ("transfer_first", 0)] + [("random", s) for s in range(3)]


@pytest.mark.parametrize("policy, seed", SCHEDULES, ids=[f"{p}-{s}" for p, s in SCHEDULES])
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "sync"])
def test_no_stale_block_is_read_while_slots_are_recycled(policy, seed, prefetch):
    cache, attend, _ = run(policy, seed, prefetch=prefetch)
    stats = cache.transfer_stats()
    assert int(attend.checked) > 10_000
    assert int(attend.stale) == 0
    assert stats["misses"] >= 0.8 * stats["dynamic"] and stats["overflow"] == 0  # slots really were recycled


@pytest.mark.parametrize("forecast", [True, False], ids=["forecast-one-layer-early", "own-layer"])
def test_sparse_schedule_without_forecast_is_safe_too(forecast):
    _, attend, _ = run("random", 5, prefetch=False, forecast=forecast)
    assert int(attend.stale) == 0 and int(attend.checked) > 0


@pytest.mark.parametrize(
    "policy, drop",
    [("compute_first", ("copied:",)), ("transfer_first", ("planned:", "read:"))],
    ids=["attention-does-not-wait-for-its-copy", "copy-waits-neither-plan-nor-reader"],
)
def test_dropping_a_wait_of_the_protocol_is_caught(policy, drop):
    _, attend, _ = run(policy, drop=drop)
    assert int(attend.stale) > 0


@pytest.mark.parametrize("policy", ["compute_first", "transfer_first"])
def test_write_backs_land_in_host_memory_whatever_the_schedule(policy):
    """Blocks filled during decode reach the host store: reading them back (host rows for old blocks) gives the keys
    that were appended, bit for bit."""
    cache, _, lengths = run(policy, steps=40)
    lay = cache.layout
    for layer in LAYERS:
        for s, n in lengths.items():
            k, v = cache.gather(layer, [s], n)
            want = keys_for(layer, s, torch.arange(n), lay.num_kv_heads, lay.head_dim, lay.block_size)
            assert torch.equal(k[0].transpose(0, 1), want) and torch.equal(v[0].transpose(0, 1), -want)


@pytest.mark.parametrize(
    "drop", [("appended",), ("staged",)], ids=["write-back-before-last-append", "prefill-copy-early"]
)
def test_dropping_a_write_back_wait_is_caught(drop):
    cache, _, lengths = run("transfer_first", drop=drop, steps=40)
    lay = cache.layout
    wrong = 0
    for layer in OFFLOADED:
        for s, n in lengths.items():
            k, _ = cache.gather(layer, [s], n)
            want = keys_for(layer, s, torch.arange(n), lay.num_kv_heads, lay.head_dim, lay.block_size)
            wrong += int((k[0].transpose(0, 1) != want).any(-1).sum())
    assert wrong > 0


class _Log(SimulatedStreams):
    """Simulated streams that log the events as they fire."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fired_order: list[str] = []

    def _step(self, queue):
        op = self.queues[queue][0]
        if op[0] == "record":
            self.fired_order.append(op[1])
        super()._step(queue)


def _copies_before_previous_reader(prefetch: bool, forecast: bool) -> tuple[int, int]:
    """Under the eager transfer queue (what a CUDA graph allows), how many copies of the last offloaded layer (5)
    completed before the step's attention of the layer before it (2) had finished reading; and how many copies ran."""
    streams = _Log("transfer_first")
    layout = BlockLayout(CFG, LAYERS, OFFLOADED, 3, 520, 2, 8, torch.float32)
    cache = BlockKVCache(layout, "cpu", prefetch=prefetch, streams=streams, use_kernel=False)
    prefill(cache, {0: 331, 2: 258})
    decode(cache, {0: 331, 2: 258}, 12, forecast=forecast)
    streams.drain()
    early = copies = 0
    reads_of_2 = 0
    for name in streams.fired_order:
        reads_of_2 += name == "read:2"
        if name == "copied:5":
            copies += 1
            early += reads_of_2 < copies  # this step's read:2 has not fired yet
    return early, copies


def test_a_copy_at_its_layer_is_not_hoisted_by_an_eager_transfer_queue():
    """Without prefetch a layer's copy waits for the layer itself (event ``asked:l``), even where the plan was made a
    layer early (the Forecast's selection) and the transfer queue runs as early as the events allow; with prefetch
    the same copy does overlap the previous layer — the negative control that the count can see it."""
    early, copies = _copies_before_previous_reader(prefetch=False, forecast=True)
    assert copies >= 12 and early == 0
    early, copies = _copies_before_previous_reader(prefetch=True, forecast=True)
    assert copies >= 12 and early >= copies - 1
