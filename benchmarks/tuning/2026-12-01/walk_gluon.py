"""Branch walk-gluon on the H200: the main pass alone (``launch._main_pass``: entry, scores and walk kernels, and for
the Gluon walk the dense ``Ct`` expansion), the Triton walk (the defaults, stored scores) against the Gluon walk at
value tiles 64 and 32. Qwen3.5-4B GDN geometry, B = 1, T = 4K / 32K / 128K; each output and final state against the
Triton walk's (relative Frobenius error). A variant that fails to build or run is a row with its error.

    PYTHONPATH=src python benchmarks/tuning/2026-12-01/walk_gluon.py   # JSON to $OUT/walk_gluon.json
"""

import dataclasses
import json
import os

import torch

from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, launch, walk_gluon
from longsparse.ops.gdn.intra import intra_forward
from longsparse.ops.gdn.select import select_events_gpu

OUT = os.environ.get("OUT", ".")
VARIANTS = [("triton", "triton", 32, "1"), ("gluon_bv64_s1", "gluon", 64, "1"), ("gluon_bv64_s2", "gluon", 64, "2")]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def rows_at(T: int) -> list[dict]:
    """One row per variant at length ``T`` (the first, the Triton walk, is the reference)."""
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    layout, bos, clen, lengths = plan.layout, plan.chunk_bos, plan.chunk_len, plan.lengths
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV), beta.reshape(T, HV)
    cfg0 = SparseGDNConfig(walk_scores="stored")
    ct, gamma, score = intra_forward(kf, vf, gf, bf, bos, clen, max_registers=cfg0.intra_registers)
    tables = dict(tier_k=plan.tier_k(cfg0.tier_ratios), table=plan.tier_table(H, cfg0.tier_ratios), index=plan.index)
    sel = select_events_gpu(layout, score, gamma, HV // H, cfg0, gate, w, details=False, **tables)
    selected = sel.mask.float().mean().item()  # one sequence: every chunk of the grid is real
    rows, ref = [], None
    for name, kernel, bv, kv in VARIANTS:
        cfg = dataclasses.replace(cfg0, walk_kernel=kernel, block_v=bv)
        walk_gluon.STAGES, walk_gluon.CTAS_PER_SM = int(kv), 2 if kv == "1" else 1

        def call(cfg=cfg):
            return launch._main_pass(
                qf, kf, vf, gf, ct, gamma, sel, layout, lengths, bos, clen, None, D**-0.5, cfg, plan=plan
            )

        try:
            o, ht = call()
            torch.cuda.synchronize()
            ref = ref or (o.clone(), ht.clone())
            row = {
                "T": T,
                "variant": name,
                "stages": kv,
                "selected_fraction": selected,
                "o_vs_triton": rel(o, ref[0]),
                "ht_vs_triton": rel(ht, ref[1]),
                "finite": bool(o.isfinite().all() and ht.isfinite().all()),
                "main_ms": benchmark(call).median_ms,
            }
        except Exception as exc:  # a variant that fails to build or run is a row, not the end of the script
            row = {"T": T, "variant": name, "error": repr(exc)[:600]}
        rows.append(row)
        print(row, flush=True)
    return rows


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,32768,131072")
    ap.add_argument("--gluon", help="comma-separated BV:STAGES builds of the Gluon walk (default 64:1,64:2)")
    args = ap.parse_args()
    if args.gluon:
        builds = [x.split(":") for x in args.gluon.split(",")]
        VARIANTS[1:] = [(f"gluon_bv{bv}_s{st}", "gluon", int(bv), st) for bv, st in builds]
    rows = []
    for T in map(int, args.lengths.split(",")):
        rows += rows_at(T)
        torch.cuda.empty_cache()
    with open(os.path.join(OUT, "walk_gluon.json"), "w") as f:
        json.dump(rows, f, indent=1)
