"""Register caps (ptxas maxnreg: more programs per SM, maybe spills) for the SparseGDN intra kernel and walk on the
H200, Qwen3.5-4B GDN geometry, B = 1: intra at 128K at caps None / 168 / 128 (4 warps) and 128 (8 warps); the main
pass alone at 4K, 32K and 128K, scores inline and stored, caps None / 168 / 128 (segments sized for the programs that
fit); then the whole op at 8K and 16K with scores inline and stored (where ``walk_scores="auto"`` switches). Every
variant's output against its group's first. The main-pass rows ran with a ``SparseGDNConfig.main_registers`` field
(a cap on the walk's kernels, sizing the segments for the programs that fit) that was removed after this run: every
cap made the walk slower. The field was never committed: it passed ``maxnreg`` to the main pass's launches and
counted resident programs as 65,536 // (cap rounded up to 8 × 32 × warps); reproducing those rows needs it back.

    PYTHONPATH=src python benchmarks/tuning/2026-11-30/registers.py   # JSON to $OUT/registers.json
"""
import json
import os

import torch

from longsparse.bench.gdn import D, H, HV, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.intra import intra_forward
from longsparse.ops.gdn.select import select_events_gpu

OUT = os.environ.get("OUT", ".")
res = {"intra": [], "main": [], "op": []}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def dump():
    json.dump(res, open(os.path.join(OUT, "registers.json"), "w"), indent=1)


for T in (131072, 32768, 4096):
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    layout, bos, clen, lengths = plan.layout, plan.chunk_bos, plan.chunk_len, plan.lengths
    kf, vf, qf = k.reshape(T, H, D), v.reshape(T, HV, D), q.reshape(T, H, D)
    gf, bf = g.reshape(T, HV), beta.reshape(T, HV)
    ct, gamma, score = intra_forward(kf, vf, gf, bf, bos, clen, max_registers=None)
    if T == 131072:
        for warps, cap in ((4, None), (4, 168), (4, 128), (8, 128)):
            def run(warps=warps, cap=cap):
                return intra_forward(kf, vf, gf, bf, bos, clen, num_warps=warps, max_registers=cap)

            out = run()
            row = {"T": T, "warps": warps, "cap": cap, "equal": all(torch.equal(a, b) for a, b in zip(out, (ct, gamma, score))),
                   "ms": benchmark(run).median_ms}
            res["intra"].append(row)
            print(row, flush=True)
    cfg0 = SparseGDNConfig()
    tables = dict(tier_k=plan.tier_k(cfg0.tier_ratios), table=plan.tier_table(H, cfg0.tier_ratios), index=plan.index)
    sel = select_events_gpu(layout, score, gamma, HV // H, cfg0, gate, w, details=False, **tables)
    for scores in ("inline", "stored"):
        ref = None
        for cap in (None, 168, 128):
            cfg = SparseGDNConfig(walk_scores=scores, main_registers=cap)

            def call(cfg=cfg):
                return launch._main_pass(qf, kf, vf, gf, ct, gamma, sel, layout, lengths, bos, clen, None, D**-0.5,
                                         cfg, plan=plan)

            o, ht = call()
            ref = ref or (o, ht)
            row = {"T": T, "scores": scores, "cap": cap, "o_vs_first_rel": rel(o, ref[0]),
                   "ht_vs_first_rel": rel(ht, ref[1]), "main_ms": benchmark(call).median_ms}
            res["main"].append(row)
            print(row, flush=True)
    dump()
for T in (8192, 16384):
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    ref = None
    for scores in ("inline", "stored"):
        cfg = SparseGDNConfig(walk_scores=scores)

        def call(cfg=cfg):
            return sparse_chunk_gated_delta_rule(q, k, v, g, beta, gate=gate, gate_norm_weight=w, config=cfg)[0]

        o = call()
        ref = o if ref is None else ref
        row = {"T": T, "scores": scores, "o_vs_first_rel": rel(o, ref), "ms": benchmark(call).median_ms}
        res["op"].append(row)
        print(row, flush=True)
dump()
