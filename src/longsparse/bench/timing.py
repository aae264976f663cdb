"""Timers: the median of many runs with device events on a GPU; a labelled wall-clock fallback on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

CPU_LABEL = "cpu wall clock: not meaningful for speed"


@dataclass(frozen=True)
class Timing:
    """One timed function. ``median_ms`` over ``runs`` runs; ``meaningful`` is False off the GPU."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    runs: int
    device: str
    meaningful: bool

    @property
    def spread(self) -> float:
        """``(p80 − p20) / median``: how far apart the runs (or a side-by-side timing's rounds) lie, relative to the
        median — a ratio of two timings that differ by less than their spreads is not a difference."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else float("nan")

    def as_dict(self) -> dict:
        d = asdict(self)
        if not self.meaningful:
            d["note"] = CPU_LABEL
        return d


def _cycled(fn: Callable, inputs: Sequence | None) -> Callable[[], object]:
    """A no-argument callable that feeds ``fn`` the next input set each call (so we do not time a warm cache)."""
    if not inputs:
        return fn
    state = {"i": 0}

    def call():
        args = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        return fn(*args) if isinstance(args, tuple) else fn(args)

    return call


def benchmark(
    fn: Callable,
    inputs: Sequence | None = None,
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 50.0,
    rep_ms: float = 300.0,
    cpu_runs: int = 5,
) -> Timing:
    """Time ``fn`` (called with each element of ``inputs`` in turn, or with no arguments).

    On CUDA: ``triton.testing.do_bench`` (device events, L2 flushed between runs) when Triton is importable,
    otherwise CUDA events around each call; warm-up first, median reported. Elsewhere: wall clock over
    ``cpu_runs`` runs after one warm-up, labelled as not meaningful for speed.
    """
    call = _cycled(fn, inputs)
    device = torch.device(device) if device is not None else _default_device()
    if device.type == "cuda":
        return _bench_cuda(call, device, warmup_ms, rep_ms)
    call()
    samples = []
    for _ in range(cpu_runs):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e3)
    return _summarise(samples, "cpu", meaningful=False)


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _summarise(samples: list[float], device: str, meaningful: bool) -> Timing:
    qs = statistics.quantiles(samples, n=5) if len(samples) > 1 else [samples[0]] * 4
    return Timing(
        median_ms=statistics.median(samples),
        p20_ms=qs[0],
        p80_ms=qs[-1],
        runs=len(samples),
        device=device,
        meaningful=meaningful,
    )


def _bench_cuda(call, device, warmup_ms, rep_ms) -> Timing:
    name = torch.cuda.get_device_name(device)
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        q = do_bench(call, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
        return Timing(median_ms=q[0], p20_ms=q[1], p80_ms=q[2], runs=-1, device=name, meaningful=True)
    call()
    torch.cuda.synchronize(device)
    samples = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while time.perf_counter() < deadline or len(samples) < 5:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return _summarise(samples, name, meaningful=True)


def benchmark_side_by_side(
    fns: dict[str, Callable[[], object]],
    rounds: int = 5,
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 60.0,
    cpu_runs: int = 3,
) -> dict[str, Timing]:
    """Time several functions against each other: ``rounds`` rounds, each timing every function once with
    :func:`benchmark` (``warmup_ms`` / ``rep_ms`` per round), the order rotated by one each round. Each function's
    :class:`Timing` summarises its rounds' medians (``runs``: the rounds).

    Why: a host-bound call's time follows the host's load, which drifts over seconds on a shared machine; timed one
    after the other, two calls can differ by 2× with identical kernels (seen in ``bench gdn`` at 4K). Interleaved,
    a drift falls on every function alike, so their ratio holds.
    """
    if rounds < 1:
        raise ValueError(f"benchmark_side_by_side: rounds must be at least 1, got {rounds}")
    if not fns:
        raise ValueError("benchmark_side_by_side: nothing to time (fns is empty)")
    names = list(fns)
    medians: dict[str, list[float]] = {name: [] for name in names}
    timings: dict[str, Timing] = {}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = benchmark(fns[name], device=device, warmup_ms=warmup_ms, rep_ms=rep_ms, cpu_runs=cpu_runs)
            medians[name].append(t.median_ms)
            timings[name] = t
    return {name: _summarise(ms, timings[name].device, timings[name].meaningful) for name, ms in medians.items()}


def host_issue_ms(
    fn: Callable[[], object], calls: int = 8, batches: int = 7, device: torch.device | str | None = None
) -> float:
    """Host time to issue one call of ``fn``, in ms: ``batches`` batches of ``calls`` calls queued back to back
    without waiting for the device, the device drained before each batch (after one warm-up call); the median batch,
    per call. Where it exceeds the device time of a call (``benchmark`` measures that with events), the call is bound
    by the host: launches and Python, not kernels. Batches are short so that the device never falls behind enough to
    make the host wait: a long queue of launches with large arguments (TMA descriptors) fills the driver's command
    buffer, and the host time would then read as the device's."""
    if calls < 1 or batches < 1:
        raise ValueError(f"host_issue_ms: calls and batches must be at least 1, got {calls} and {batches}")
    device = torch.device(device) if device is not None else _default_device()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    per_call = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) * 1e3 / calls)
    sync()
    return statistics.median(per_call)


def peak_memory_increment(fn: Callable[[], object], device: torch.device | str | None = None) -> int:
    """Bytes allocated at the peak of one call of ``fn`` beyond what was allocated before it (CUDA only; 0 on CPU).

    The result of ``fn`` is kept alive until the peak is read, so outputs count towards the increment.
    """
    device = torch.device(device) if device is not None else _default_device()
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return peak - before


def gbps(bytes_moved: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second)."""
    return bytes_moved / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    """Achieved arithmetic rate in TFLOP/s."""
    return flops / (ms * 1e-3) / 1e12


class Clock:
    """Elapsed milliseconds (``.ms``) of a ``with`` region: CUDA events on a GPU (the region's device time, one
    synchronisation at its end), the wall clock elsewhere."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.end.record()
            self.end.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def time_steps(stepper, steps: int, device: torch.device) -> float:
    """Milliseconds per step over ``steps`` calls of ``stepper.step()``."""
    with Clock(device) as clock:
        for _ in range(steps):
            stepper.step()
    return clock.ms / steps


def self_time_by_kernel_us(fn: Callable[[], object], calls: int = 10, device: torch.device | str | None = None):
    """Mean self time per call of every kernel ``fn`` runs, in µs, by torch.profiler: ``{name: µs}``, longest first.
    On a CUDA device the device kernels (CUDA activity; the H200 has no nsys), elsewhere the CPU operators. One
    warm-up call first, synchronised, so compilation and caches fall outside the profile."""
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device) if device is not None else _default_device()
    if calls < 1:
        raise ValueError(f"self_time_by_kernel_us: calls must be at least 1, got {calls}")
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        sync()
    # the attribute's name moved between torch releases (cuda -> device)
    names = ("self_device_time_total", "self_cuda_time_total") if cuda else ("self_cpu_time_total",)
    times: dict[str, float] = {}
    for event in prof.key_averages():
        us = next((float(getattr(event, n)) for n in names if hasattr(event, n)), 0.0)
        if us > 0:
            times[event.key] = times.get(event.key, 0.0) + us / calls
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def kernel_times(fn: Callable[[], object], calls: int = 10, warmup: int = 2, width: int = 90) -> dict:
    """:func:`self_time_by_kernel_us` as the tuning scripts record it: ``{"kernels_us": {name: µs per call, longest
    first}, "sum_us": their sum, "clock": "device" or "cpu"}``, names cut to ``width`` characters, after ``warmup``
    calls. Where ``fn`` runs CUDA kernels, their device time; where it runs none (no CUDA, or work on CPU tensors)
    the CPU operators' own time, a profile of what runs rather than a speed."""
    for _ in range(warmup - 1):  # self_time_by_kernel_us makes the last warm-up call itself
        fn()
    by_kernel = self_time_by_kernel_us(fn, calls) if torch.cuda.is_available() else {}
    clock = "device" if by_kernel else "cpu"
    if not by_kernel:  # no kernel ran: the CPU operators, so that CPU work on a CUDA machine is seen
        by_kernel = self_time_by_kernel_us(fn, calls, device="cpu")
    times: dict[str, float] = {}
    for name, us in by_kernel.items():
        times[name[:width]] = round(times.get(name[:width], 0.0) + us, 2)
    times = dict(sorted(times.items(), key=lambda kv: -kv[1]))
    return {"kernels_us": times, "sum_us": round(sum(times.values()), 1), "clock": clock}
