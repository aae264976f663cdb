"""SparseGDN walk variants (chunk addresses from the index arrays) on the H200: W correction form (Ct V − (Ct e^G K) S vs Ct (V − e^G ⊙ K S)) x pipeline
value tile (32, 64) x segment length, main pass alone at T = 4K and 128K (Qwen3.5-4B GDN geometry, B = 1), each
variant's output against the first one's (and at 4K against the fp32 specification on the same mask); then a
torch.profiler trace of one whole op call at 4K (kernels and host time).

    PYTHONPATH=src python benchmarks/tuning/2026-11-30/walk_var.py   # JSON to $OUT/walk_var.json
    WALK_VAR_PROFILE=1 ...   # also the spec check and the profile of one op call at 4K
"""
import itertools
import json
import os
import shutil
import time

import torch

from longsparse.bench.gdn import D, H, HV, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.intra import intra_forward
from longsparse.ops.gdn.select import select_events_gpu

OUT = os.environ.get("OUT", ".")
res = {"tools": {t: shutil.which(t) for t in ("ncu", "nsys")}, "rows": []}
T0 = time.time()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# segment lengths tried besides the default (None); the first run (2026-11-30 18:40, before the default became one
# wave) had (None, 256, 128, 64) at 128K and (None, 4) at 4K: walk_var.json
SEGMENTS = {4096: (None, 8), 32768: (None, 128), 131072: (None, 256)}
PROFILE = os.environ.get("WALK_VAR_PROFILE") == "1"
for T in SEGMENTS:
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    layout, bos, clen, lengths = plan.layout, plan.chunk_bos, plan.chunk_len, plan.lengths
    kf, vf, qf = k.reshape(T, H, D), v.reshape(T, HV, D), q.reshape(T, H, D)
    gf, bf = g.reshape(T, HV), beta.reshape(T, HV)
    ct, gamma, score = intra_forward(kf, vf, gf, bf, bos, clen)
    cfg0 = SparseGDNConfig()
    tables = dict(tier_k=plan.tier_k(cfg0.tier_ratios), table=plan.tier_table(H, cfg0.tier_ratios), index=plan.index)
    sel = select_events_gpu(layout, score, gamma, HV // H, cfg0, gate, w, details=False, **tables)
    ref = None
    segs = SEGMENTS[T]
    for reassoc, bv, seg in [(False, 64, None)] + list(itertools.product((False, True), (64, 32), segs)):
        cfg = SparseGDNConfig(block_v=bv, segment_chunks=seg, walk_correction="ks" if reassoc else "w")

        def call(cfg=cfg):
            return launch._main_pass(qf, kf, vf, gf, ct, gamma, sel, layout, lengths, bos, clen, None, D**-0.5, cfg,
                                     plan=plan)

        t_c = time.time()
        o, ht = call()
        torch.cuda.synchronize()
        compile_s = time.time() - t_c
        row = {"T": T, "reassoc": reassoc, "block_v": bv, "segment_chunks": seg, "compile_s": round(compile_s, 1)}
        if ref is None:
            ref = (o, ht)
        row["o_vs_first_rel"] = rel(o, ref[0])
        row["ht_vs_first_rel"] = rel(ht, ref[1])
        row["main_ms"] = benchmark(call).median_ms
        res["rows"].append(row)
        print(row, flush=True)
    if T == 4096 and PROFILE:  # against the specification (fp32, the same mask) through the public op, every form
        from longsparse.ops.gdn.spec.pipeline import run_spec

        rep = HV // H
        qe, ke = (x.float().repeat_interleave(rep, 2) for x in (q, k))
        trace = run_spec(qe, ke, v.float(), g, beta, group=rep, scale=D**-0.5, config=SparseGDNConfig(backend="torch"),
                         gate=gate.float(), gate_norm_weight=w)
        from longsparse.ops.gdn.launch import run_kernels

        for form in ("w", "ks"):
            o = run_kernels(q, k, v, g, beta, gate=gate, gate_norm_weight=w, mask=trace.selection.mask,
                            config=SparseGDNConfig(walk_correction=form))[0]
            res[f"spec_rel_4k_{form}"] = rel(o, trace.o)
        # one whole op call: kernels and host time
        op = lambda: sparse_chunk_gated_delta_rule(q, k, v, g, beta, gate=gate, gate_norm_weight=w)  # noqa: E731
        for _ in range(3):
            op()
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                op()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        res["profile_4k"] = table
        events = [
            {"name": e.key, "count": e.count, "cpu_us": e.self_cpu_time_total / e.count,
             "dev_us": e.self_device_time_total / max(e.count, 1)}
            for e in prof.key_averages()
        ]
        res["profile_4k_events"] = sorted(events, key=lambda e: -e["cpu_us"] * e["count"])[:60]
        res["op_4k_ms"] = benchmark(op).median_ms
        print(table, flush=True)
    del q, k, v, g, beta, gate, ct, sel
    torch.cuda.empty_cache()
res["wall_s"] = time.time() - T0
with open(os.path.join(OUT, "walk_var.json"), "w") as f:
    json.dump(res, f, indent=1)
