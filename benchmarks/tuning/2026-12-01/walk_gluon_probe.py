"""Branch walk-gluon, on the H200: where the Gluon walk departs from the Triton walk. ``launch._main_pass`` with
both walk kernels under one forced mask (all chunks selected, none, alternating, random halves, the selector's
own); the output's relative error per chunk and per value head, the final state's, and the first chunk where the
error passes 2^-8. One case per process (``--case``): an illegal address poisons its CUDA context, not the sweep.

    PYTHONPATH=src python benchmarks/tuning/2026-12-01/walk_gluon_probe.py            # every case; JSON to $OUT
    PYTHONPATH=src python benchmarks/tuning/2026-12-01/walk_gluon_probe.py --case 128:none:64
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import torch

OUT = os.environ.get("OUT", ".")
CASES = [f"{T}:{m}:{bv}" for T in (128, 512, 4096) for m in ("all", "none", "alt", "half", "selector") for bv in (64,)]
CASES += ["4096:selector:32", "32768:selector:64"]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def run_case(case: str) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from longsparse.bench.gdn import HV, D, H, make_inputs
    from longsparse.ops.gdn import SparseGDNConfig, launch
    from longsparse.ops.gdn.intra import intra_forward
    from longsparse.ops.gdn.select import select_events_gpu

    T, how, bv = case.split(":")
    T, bv = int(T), int(bv)
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    layout, bos, clen, lengths = plan.layout, plan.chunk_bos, plan.chunk_len, plan.lengths
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV), beta.reshape(T, HV)
    from longsparse.ops.gdn import walk_gluon

    st = int(os.environ.get("PROBE_STAGES", walk_gluon.STAGES))
    walk_gluon.STAGES, walk_gluon.CTAS_PER_SM = st, 2 if st == 1 else 1
    cfg0 = SparseGDNConfig(walk_scores="stored", block_v=bv)
    ct, gamma, score = intra_forward(kf, vf, gf, bf, bos, clen, max_registers=cfg0.intra_registers)
    tables = dict(tier_k=plan.tier_k(cfg0.tier_ratios), table=plan.tier_table(H, cfg0.tier_ratios), index=plan.index)
    sel = select_events_gpu(layout, score, gamma, HV // H, cfg0, gate, w, details=False, **tables)
    NC = layout.NC
    chunks = torch.arange(sel.mask.shape[-1], device=q.device)
    forced = {
        "all": torch.ones_like(sel.mask),
        "none": torch.zeros_like(sel.mask),
        "alt": (chunks % 2 == 0).expand_as(sel.mask).clone(),
        "half": torch.rand(sel.mask.shape, generator=torch.Generator(q.device).manual_seed(0), device=q.device) < 0.5,
        "selector": sel.mask,
    }[how].to(sel.mask.dtype)
    selection = dataclasses.replace(sel, mask=forced)
    out = {}
    for kernel in ("triton", "gluon"):
        cfg = dataclasses.replace(cfg0, walk_kernel=kernel)
        o, ht = launch._main_pass(
            qf, kf, vf, gf, ct, gamma, selection, layout, lengths, bos, clen, None, D**-0.5, cfg, any_mask=True,
            plan=plan,
        )  # fmt: skip
        torch.cuda.synchronize()
        out[kernel] = (o.float(), ht)
    (ot, st), (og, sg) = out["triton"], out["gluon"]
    per_chunk = [rel(og[64 * c : 64 * c + 64], ot[64 * c : 64 * c + 64]) for c in range(NC)]
    per_head = [rel(og[:, h], ot[:, h]) for h in range(HV)]
    bad = [c for c, e in enumerate(per_chunk) if e > 2**-8]
    ref = {}
    if how in ("all", "none") and T == 128:  # torch products of the same bf16 tiles for value head 0, V tile 0
        from walk_gluon_debug import reference

        from longsparse.ops.gdn import walk_gluon
        from longsparse.ops.gdn.fused import sparse_gdn_fwd_kernel_scores

        scores = torch.empty(NC, HV, 64, 64, dtype=q.dtype, device=q.device)
        sparse_gdn_fwd_kernel_scores[(NC, H)](qf, kf, gf, scores, bos, clen, H=H, HV=HV, K=D, IEEE=False)
        want = reference(qf, kf, vf, gf, scores, walk_gluon.dense_coefficients(ct), how == "all")
        for c in (0, 1):
            w = D**-0.5 * want[c]["O (unscaled)"]
            for kernel, (o_k, _) in out.items():
                ref[f"{kernel}_chunk{c}_vs_torch"] = rel(o_k[64 * c : 64 * c + 64, 0, :64], w)
    return {
        **ref,
        "case": case,
        "selected_fraction": forced.float().mean().item(),
        "o_rel": rel(og, ot),
        "ht_rel": rel(sg, st),
        "first_bad_chunk": bad[0] if bad else None,
        "bad_chunks": len(bad),
        "per_chunk_head": [round(e, 4) for e in per_chunk[:8]],
        "per_value_head": [round(e, 4) for e in per_head],
        "per_v_tile": [rel(og[..., i : i + bv], ot[..., i : i + bv]) for i in range(0, D, bv)],
        "finite": bool(og.isfinite().all() and sg.isfinite().all()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case")
    ap.add_argument("--cases", help="comma-separated cases (default: all)")
    ap.add_argument("--stages", default="1", help="comma-separated tile stages (walk_gluon.STAGES)")
    args = ap.parse_args()
    if args.case:
        print("ROW " + json.dumps(run_case(args.case)), flush=True)
        return
    rows = []
    cases = args.cases.split(",") if args.cases else CASES
    for stages, case in ((v, c) for v in args.stages.split(",") for c in cases):
        env = dict(os.environ, PROBE_STAGES=stages)
        try:
            p = subprocess.run(
                [sys.executable, __file__, "--case", case], capture_output=True, text=True, timeout=120, env=env
            )
            lines = [x for x in p.stdout.splitlines() if x.startswith("ROW ")]
            row = json.loads(lines[0][4:]) if lines else {"case": case, "error": (p.stderr or p.stdout)[-300:]}
        except subprocess.TimeoutExpired:
            row = {"case": case, "error": "timeout"}
        row["stages"] = stages
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(OUT, "walk_gluon_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
