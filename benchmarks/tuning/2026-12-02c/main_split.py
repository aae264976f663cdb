"""To run on the H200: one SparseGDN op call's device time split by kernel (torch.profiler, CUDA activity), at the
Qwen3.5-4B GDN geometry, B = 1, T = 32K and 128K: intra, the selector's launches, the entry kernel, the Gluon walk
and anything else the call launches (allocations' memsets, conversions). ``bench gdn`` times the main pass (entry +
walk) as one stage; this says how much of it is the walk's chain of chunk steps. Then the op at 128K with the event
mask forced to none, the selector's and every chunk (``launch.run_kernels(mask=)``), side by side: what the
selected steps' state updates cost beside the steps' other work (the output, the would-be write), i.e. how much
taking the output off the state chain could reach (docs/gdn-kernels.md, Open problems (i)).
``python3 benchmarks/tuning/2026-12-02c/main_split.py`` (~1 min, no peers); writes ``$OUT/main_split.json``."""

import json
import os
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark_side_by_side
from longsparse.ops.gdn import launch, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.launch import plan_launch

CALLS = 10


def device_us(event) -> float:
    """An event's own device time in µs (the attribute's name moved between torch releases)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def split(T: int) -> dict:
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = plan_launch(1, T, None, q.device)

    def call():
        return sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan
        )

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    for event in prof.key_averages():
        if device_us(event) > 0:
            per_kernel[event.key] += device_us(event) / CALLS
    total = sum(per_kernel.values())
    row = {"T": T, "device_us_per_call": total, "kernels_us": dict(sorted(per_kernel.items(), key=lambda x: -x[1]))}
    print(json.dumps(row, indent=1), flush=True)
    return row


def forced_masks(T: int) -> dict:
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = plan_launch(1, T, None, q.device)
    P, C = q.shape[2], plan.layout.Cmax
    masks = {
        "none": torch.zeros(1, P, C, dtype=torch.bool, device=q.device),
        "selector": None,
        "all": torch.ones(1, P, C, dtype=torch.bool, device=q.device),
    }

    def op(mask):
        return lambda: launch.run_kernels(
            q, k, v, g, beta, gate=gate, gate_norm_weight=w, mask=mask, plan=plan, details=False
        )

    times = benchmark_side_by_side({name: op(mask) for name, mask in masks.items()}, rounds=5)
    row = {"T": T, **{f"mask_{name}_ms": t.median_ms for name, t in times.items()}}
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    result = {"split": [split(T) for T in (32768, 131072)], "forced_masks": forced_masks(131072)}
    with open(os.path.join(os.environ.get("OUT", "."), "main_split.json"), "w") as f:
        json.dump(result, f, indent=1)
