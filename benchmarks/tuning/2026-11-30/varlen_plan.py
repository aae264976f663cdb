"""SparseGDN on packed prompts on the H200, each call given its launch plan (built once, outside the timing), so the
times are the GPU's and not the host's per-call planning: the whole op at the Qwen3.5-4B GDN geometry (bf16) for
128K + 1K, 64K + 32K + 16K + 16K, 96K + 32K and 8 x 16K, at the tree's own segment length (``default``), main's rule
(``main_rule``: one full wave for equal lengths, ~2 programs per resident slot for unequal ones), the makespan
planner's (``planner``, where the tree has it), the longest sequence cut into 2-8 segments, and one segment per
sequence (``reference``: no warm-ups, the exact walk from every sequence's start), which every row's output and final
state are compared with. Per row: segment length, segments, programs (segments x value heads x V tiles), ms.

Per case also: the host time of a new launch plan (``plan_launch`` + its default segment plan), of ``plan_for``
(what a call without a plan does: a new plan each call on trees without ``launch.varlen_plan``, the kept one with
it), and the op timed at the default without ``plan=`` (``no_plan_ms``), which pays that host work per call.

Runs from either tree (main, ``varlen-plan``, ``varlen-plan2``): it uses only what they share and asks for the rest
with ``getattr``; ``features`` in the JSON records which tree ran (segment-major launch, planner, kept varlen plans).

    PYTHONPATH=src python benchmarks/tuning/2026-11-30/varlen_plan.py   # JSON to $OUT/varlen_plan.json
"""

import json
import math
import os
import statistics
import time

import torch

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, fused, launch, sparse_chunk_gated_delta_rule

OUT = os.environ.get("OUT", ".")
K16 = 16384
CASES = {
    "128k+1k": [8 * K16, 1024],
    "64k+32k+16k+16k": [4 * K16, 2 * K16, K16, K16],
    "96k+32k": [6 * K16, 2 * K16],
    "8x16k": [K16] * 8,
}
SPLITS = (2, 3, 4, 6, 8)  # the longest sequence cut into this many segments
dev = torch.device("cuda")
cfg0 = SparseGDNConfig()
width = 32 * (128 // cfg0.block_v)  # programs per segment: HV x V tiles
slots = launch.resident_programs(cfg0.main_warps) * torch.cuda.get_device_properties(dev).multi_processor_count


def even(n):
    n = max(launch.MIN_SEGMENT_CHUNKS, n)
    return n + n % 2


def main_rule(chunks):
    """main's ``default_segment_length`` (as of a49422c), computed here so that every tree times main's choice."""
    total = width * len(chunks)
    if len({C for C in chunks if C}) <= 1:
        return even(math.ceil(max(chunks) / max(1, slots // total)))
    return even(math.ceil(max(chunks) / math.ceil(2 * slots / total)))


def host_ms(fn, reps=20):
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_case(name, lengths):
    """The case's rows (every pick of segment length, timed with the plan passed) and its summary."""
    T = sum(lengths)
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=dev, dtype=torch.int32)
    chunks = [-(-n // 64) for n in lengths]
    plan = launch.plan_launch(1, T, cu, dev)  # once: every timed call below passes it
    picks = {"default": None, "main_rule": main_rule(chunks)}
    old = getattr(launch, "default_segment_length", None)  # main's own rule, where the tree has it
    if old is not None:
        assert old(chunks, width, slots) == picks["main_rule"], "main_rule differs from the tree's"
    if features["planner"]:
        picks["planner"] = launch.segment_length(chunks, width, slots)
    for split in SPLITS:
        picks[f"split{split}"] = even(math.ceil(max(chunks) / split))
    picks["reference"] = even(max(chunks))

    def call(seg, plan=plan):
        cfg = SparseGDNConfig(segment_chunks=seg)
        return sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, cu_seqlens=cu, gate=gate, gate_norm_weight=w, config=cfg, output_final_state=True,
            plan=plan,
        )  # fmt: skip

    ref_o, ref_ht = call(picks["reference"])
    timed = {}  # segment_chunks -> (ms, rel-diffs): each setting timed once, whichever picks share it
    rows = []
    for pick, seg in picks.items():
        segs = plan.segments(width, slots, seg)
        if seg not in timed:
            o, ht = call(seg)
            timed[seg] = (benchmark(lambda seg=seg: call(seg)).median_ms, rel(o, ref_o), rel(ht, ref_ht))
        ms, o_rel, ht_rel = timed[seg]
        row = dict(case=name, pick=pick, segment_chunks=int((segs.c1 - segs.c0).max().item()), segments=segs.count)
        row.update(programs=segs.count * width, ms=ms, o_vs_reference_rel=o_rel, ht_vs_reference_rel=ht_rel)
        rows.append(row)
        print(row, flush=True)
    summary = {
        "lengths": lengths,
        "chunks": chunks,
        "default_segment_chunks": rows[0]["segment_chunks"],
        "fastest": min(rows, key=lambda r: r["ms"])["pick"],
        "plan_launch_host_ms": host_ms(lambda: launch.plan_launch(1, T, cu, dev).segments(width, slots, None)),
        "plan_for_host_ms": host_ms(lambda: launch.plan_for(1, T, cu, dev)),
        "no_plan_ms": benchmark(lambda: call(None, plan=None)).median_ms,
        "plan_ms": rows[0]["ms"],
    }
    print(name, summary, flush=True)
    return rows, summary


features = {
    "segment_major": hasattr(fused, "_segment_program"),
    "planner": hasattr(launch, "walk_makespan"),
    "kept_varlen_plans": hasattr(launch, "varlen_plan"),
}
res = {"features": features, "slots": slots, "programs_per_segment": width, "cases": {}, "rows": []}
print(features, "slots", slots, flush=True)
for name, lengths in CASES.items():
    rows, res["cases"][name] = run_case(name, lengths)
    res["rows"] += rows
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(OUT, "varlen_plan.json"), "w"), indent=1)
