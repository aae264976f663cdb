"""Where one SparseGDN call's time goes at short T on the H200: the host's time to issue a call (calls queued
without waiting), the GPU's kernel time per call (torch.profiler, per kernel), the call replayed from a CUDA graph,
and the host's Python profile. Qwen3.5-4B GDN geometry, B = 1, bf16; the op as `bench gdn` calls it (gate and
norm weight for visibility, final state), plain and with a caller-built launch plan.

    PYTHONPATH=src python benchmarks/tuning/2026-12-01/host_overhead.py   # $OUT/host_overhead.json, host_profile.txt
"""

import cProfile
import io
import json
import os
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import launch, sparse_chunk_gated_delta_rule

OUT = os.environ.get("OUT", ".")
CALLS = 50
rows, profiles = [], []


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def device_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return getattr(event, name)
    return float("nan")


for T in (4096, 16384, 32768):
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)

    def op(plan=None):
        return sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan
        )

    ref = op(plan)
    torch.cuda.synchronize()
    row = {"T": T, "bench_ms": benchmark(op).median_ms, "bench_planned_ms": benchmark(lambda: op(plan)).median_ms}
    for name, fn in (("plain", op), ("planned", lambda: op(plan))):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        row[f"host_issue_{name}_ms"] = (t1 - t0) / CALLS * 1e3
        row[f"wall_{name}_ms"] = (t2 - t0) / CALLS * 1e3
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            op(plan)
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        us = device_us(e)
        if us and us == us and us > 0 and e.device_type.name == "CUDA":
            kernels[e.key] = {"calls_per_op": e.count / 10, "us_per_op": us / 10}
    row["gpu_kernels"] = kernels
    row["gpu_us_per_op"] = sum(x["us_per_op"] for x in kernels.values())
    cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:20]
    row["cpu_top"] = {e.key: {"count_per_op": e.count / 10, "self_us_per_op": e.self_cpu_time_total / 10} for e in cpu}
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                op(plan)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = op(plan)
        graph.replay()
        torch.cuda.synchronize()
        row["graph_ms"] = benchmark(graph.replay).median_ms
        row["graph_o_vs_eager"] = rel(captured[0], ref[0])
    except Exception as exc:  # a call that cannot be captured is a finding, not the end of the script
        row["graph_error"] = repr(exc)[:400]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(CALLS):
        op(plan)
    pr.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(30)
    profiles.append(f"==== T = {T}, {CALLS} planned calls ====\n{text.getvalue()}")
    rows.append(row)
    print({k_: v_ for k_, v_ in row.items() if k_ not in ("gpu_kernels", "cpu_top")}, flush=True)
    json.dump(rows, open(os.path.join(OUT, "host_overhead.json"), "w"), indent=1)
    open(os.path.join(OUT, "host_profile.txt"), "w").write("\n".join(profiles))
