"""The benchmark harness: labelled CPU timings, JSON results with a summary, tables, plots, peer bundles."""

import json
import math
import os
import zipfile

import pytest
import torch

from longsparse.bench import (
    BenchmarkResult,
    benchmark,
    benchmark_side_by_side,
    format_table,
    gbps,
    host_issue_ms,
    load,
    peers,
    ratio,
)
from longsparse.bench.timing import CPU_LABEL


def test_cpu_timing_is_labelled_meaningless():
    calls = []
    t = benchmark(lambda x: calls.append(x), inputs=[1, 2, 3], device="cpu", cpu_runs=4)
    assert not t.meaningful and t.device == "cpu"
    assert t.as_dict()["note"] == CPU_LABEL
    assert calls == [1, 2, 3, 1, 2]  # one warm-up, four timed runs, inputs rotated
    assert t.p20_ms <= t.median_ms <= t.p80_ms


def test_side_by_side_timing_rotates_the_order_each_round():
    """Each round times every function once, starting one later than the round before; each function's timing
    summarises its rounds (on the CPU: a warm-up and ``cpu_runs`` timed calls per round)."""
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("ours", "fla", "flashqla")}
    timings = benchmark_side_by_side(fns, rounds=4, device="cpu", cpu_runs=2)
    firsts = order[::3]  # every function runs 3 times per round: warm-up + 2 timed
    assert firsts[:3] == ["ours", "fla", "flashqla"] and firsts[3:6] == ["fla", "flashqla", "ours"]
    assert order.count("ours") == 4 * 3
    for t in timings.values():
        assert t.runs == 4 and not t.meaningful and t.p20_ms <= t.median_ms <= t.p80_ms
        assert t.spread == (t.p80_ms - t.p20_ms) / t.median_ms
    with pytest.raises(ValueError, match="rounds"):
        benchmark_side_by_side(fns, rounds=0, device="cpu")
    with pytest.raises(ValueError, match="empty"):
        benchmark_side_by_side({}, device="cpu")


def test_spread_is_the_middle_three_fifths_over_the_median():
    from longsparse.bench.timing import Timing

    t = Timing(median_ms=2.0, p20_ms=1.9, p80_ms=2.2, runs=5, device="x", meaningful=True)
    assert t.spread == pytest.approx(0.15)
    assert math.isnan(Timing(0.0, 0.0, 0.0, 1, "x", True).spread)


def test_result_file_round_trips_with_environment(tmp_path):
    res = BenchmarkResult("unit")
    res.add(case="T1K", ours_ms=1.0, peer_ms=2.0, bad=float("nan"))
    res.summary["speedup"] = ratio(2.0, 1.0)
    path = res.save(tmp_path)
    data = load(path)
    assert data["summary"] == {"speedup": 2.0}
    assert data["rows"][0]["bad"] is None  # NaN is not JSON
    env = data["environment"]
    for key in ("device", "torch", "date", "command", "versions"):
        assert key in env
    json.loads(path.read_text())


def test_recorded_commit_is_the_override_where_one_is_set(monkeypatch):
    """A copy of the tree whose git metadata is not its own names its commit through the environment."""
    from longsparse.reports.results import GIT_COMMIT_ENV, environment

    monkeypatch.setenv(GIT_COMMIT_ENV, "abc1234")
    assert environment()["git_commit"] == "abc1234"
    monkeypatch.delenv(GIT_COMMIT_ENV)
    assert environment()["git_commit"] != "abc1234"


def test_load_rejects_a_file_without_summary(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="summary"):
        load(p)


def test_table_and_ratio():
    text = format_table([{"T": "4K", "ours": 1.25, "fla": 2.5, "x": None}], ["T", "ours", "fla", "x"])
    lines = text.splitlines()
    assert lines[0].split() == ["T", "ours", "fla", "x"]
    assert lines[2].split() == ["4K", "1.250", "2.500", "-"]
    assert ratio(None, 1.0) is None and ratio(3.0, 1.5) == 2.0
    assert math.isclose(gbps(4.25e9, 1000.0), 4.25)


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    from longsparse.reports.plot import line_plot, stacked_bars

    p = line_plot(
        tmp_path / "a.png",
        [4096, 8192],
        {"ours": [1.0, 2.0], "peer": [None, 3.0]},
        title="t",
        xlabel="T",
        ylabel="ms",
        xticklabels=["4K", "8K"],
    )
    q = stacked_bars(tmp_path / "b.png", ["8K", "32K"], {"gdn": [1, 2], "attn": [2, 3]}, title="t", ylabel="ms")
    assert p.stat().st_size > 1000 and q.stat().st_size > 1000


def _fake_wheel(path, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def test_peer_bundle_drops_duplicate_z3_library(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(
        wheels / "z3_solver-1-py3-none-any.whl",
        {
            "z3/__init__.py": "",
            "z3/lib/libz3.so": b"\0" * 1000,
            "z3/lib/libz3.so.4.15": b"\1" * 1000,
            "z3_solver-1.data/data/bin/z3": b"\2" * 1000,
        },
    )
    _fake_wheel(wheels / "fla-1-py3-none-any.whl", {"fla/__init__.py": "__version__ = '1'\n"})
    bundle = peers.bundle(wheels, tmp_path / "peers.tar.xz")
    site = peers.install(bundle, tmp_path / "site")
    assert (site / "fla" / "__init__.py").exists()
    assert os.path.islink(site / "z3" / "lib" / "libz3.so")
    assert (site / "z3" / "lib" / "libz3.so").read_bytes() == b"\1" * 1000
    assert not list(site.glob("*.data"))


def test_missing_peers_are_none(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "flash_qla", None)
    assert peers.flashqla_chunk_gated_delta_rule() is None


def test_peak_memory_is_zero_on_cpu():
    from longsparse.bench import peak_memory_increment

    assert peak_memory_increment(lambda: torch.ones(10), device="cpu") == 0


def test_host_issue_time_is_the_hosts_time_per_call():
    """``host_issue_ms`` times the host's side of a call: a call that spends 3 ms on the host reads about 3 ms (the
    warm-up call not counted, the median of the batches); counts below one are refused."""
    import time

    seen = []

    def call():
        seen.append(1)
        time.sleep(0.003)

    t = host_issue_ms(call, calls=5, batches=3, device="cpu")
    assert len(seen) == 1 + 3 * 5 and 2.9 <= t < 30
    with pytest.raises(ValueError, match="at least 1"):
        host_issue_ms(call, calls=0)
    with pytest.raises(ValueError, match="at least 1"):
        host_issue_ms(call, batches=0)


def test_self_time_by_kernel_names_the_operators_a_call_runs():
    """On the CPU the profiler's operators: a matmul call shows its matmul with a positive mean time, and no
    operator the call never ran; a call count below one is refused."""
    from longsparse.bench.timing import self_time_by_kernel_us

    a = torch.randn(256, 256)
    times = self_time_by_kernel_us(lambda: a @ a, calls=3, device="cpu")
    assert any("mm" in name for name in times) and all(t > 0 for t in times.values())
    assert not any("conv" in name for name in times)
    assert list(times.values()) == sorted(times.values(), reverse=True)
    with pytest.raises(ValueError, match="calls must be at least 1"):
        self_time_by_kernel_us(lambda: a @ a, calls=0, device="cpu")


def test_kernel_times_names_what_ran_and_sums_it():
    """Work on CPU tensors is profiled by the CPU operators' time, on a CUDA machine too: the operators a call ran
    (here a matrix product), per call, longest first."""
    from longsparse.bench.timing import kernel_times

    a = torch.randn(256, 256)
    prof = kernel_times(lambda: a @ a, calls=3, warmup=1, width=12)
    times = prof["kernels_us"]
    assert any(name.startswith("aten::mm") for name in times), times
    assert all(len(name) <= 12 and us > 0 for name, us in times.items())
    assert list(times.values()) == sorted(times.values(), reverse=True)
    assert abs(prof["sum_us"] - sum(times.values())) < 0.1 * len(times)
    assert prof["clock"] == "cpu"
