"""Builds of the Gluon walk (``walk_gluon``'s module switches, the value tile) and the intra-chunk scores stored by
intra's programs, on the H200. Qwen3.5-4B GDN geometry, B = 1.

Two runs (README.md beside this), each on the commit that had its switches, since removed: the first timed
``LAZY_STATE`` / ``SKIP_IDLE_WRITE`` / ``SPLIT_LOADS`` (commit 5963b44, whose copy of this script lists them), the
second the value tile, ``CT_IN_REGISTERS``, ``MAX_REGISTERS`` and ``CTAS_PER_SM`` (commit 1829b1a, the variants
below). Ct from registers is now the kernel's only form, so on later trees only ``base`` and ``bv32`` run; the
others stop with a clear error.

* Intra (in the first variant's process): ``intra_forward`` alone, the scores kernel alone, and ``intra_forward``
  storing the scores itself, at each length; coefficients and scores compared bit for bit.
* Walk variants, one process each (an illegal address poisons only its own CUDA context): the main pass with the
  scores given (entry + walk kernels) against the Triton walk (stored scores, its default tile), under the
  selector's mask at every length and, at the shortest, under forced masks (all chunks selected, none, alternating,
  random halves); output and final state errors against the Triton walk; time under the selector's mask.

    PYTHONPATH=src python benchmarks/tuning/2026-12-01/walk_variants.py     # JSON to $OUT/walk_variants.json
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import torch

OUT = os.environ.get("OUT", ".")
VARIANTS = {  # name: (value tile, walk_gluon switches)
    "base": (64, {}),
    "ct64": (64, dict(CT_IN_REGISTERS=True)),
    "bv32": (32, {}),
    "ct32": (32, dict(CT_IN_REGISTERS=True)),
    "ct32_r168_3": (32, dict(CT_IN_REGISTERS=True, MAX_REGISTERS=168, CTAS_PER_SM=3)),
    "ct32_r168_2": (32, dict(CT_IN_REGISTERS=True, MAX_REGISTERS=168)),
}
FORCED = ("all", "none", "alt", "half")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def prepare(T: int):
    """Inputs, plan, intra (scores stored by it) and the selector's selection at length ``T``."""
    from longsparse.bench.gdn import HV, D, H, make_inputs
    from longsparse.ops.gdn import SparseGDNConfig, launch
    from longsparse.ops.gdn.intra import intra_forward
    from longsparse.ops.gdn.select import select_events_gpu

    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    layout = plan.layout
    x = dict(
        q=q.reshape(T, H, D), k=k.reshape(T, H, D), v=v.reshape(T, HV, D), g=g.reshape(T, HV),
        beta=beta.reshape(T, HV), plan=plan,
    )  # fmt: skip
    cfg = SparseGDNConfig()
    x["scores"] = torch.empty(layout.NC, HV, 64, 64, dtype=q.dtype, device=q.device)
    x["ct"], x["gamma"], score = intra_forward(
        x["k"], x["v"], x["g"], x["beta"], plan.chunk_bos, plan.chunk_len, max_registers=cfg.intra_registers,
        q=x["q"], scores=x["scores"],
    )  # fmt: skip
    tables = dict(tier_k=plan.tier_k(cfg.tier_ratios), table=plan.tier_table(H, cfg.tier_ratios), index=plan.index)
    x["sel"] = select_events_gpu(layout, score, x["gamma"], HV // H, cfg, gate, w, details=False, **tables)
    return x


def forced_selection(sel, how: str):
    chunks = torch.arange(sel.mask.shape[-1], device=sel.mask.device)
    mask = {
        "selector": sel.mask,
        "all": torch.ones_like(sel.mask),
        "none": torch.zeros_like(sel.mask),
        "alt": (chunks % 2 == 0).expand_as(sel.mask).clone(),
        "half": torch.rand(sel.mask.shape, generator=torch.Generator(sel.mask.device).manual_seed(0),
                           device=sel.mask.device) < 0.5,
    }[how].to(sel.mask.dtype)  # fmt: skip
    return dataclasses.replace(sel, mask=mask)


def main_pass(x, selection, config):
    from longsparse.bench.gdn import D
    from longsparse.ops.gdn import launch

    plan = x["plan"]
    return launch._main_pass(
        x["q"], x["k"], x["v"], x["g"], x["ct"], x["gamma"], selection, plan.layout, plan.lengths, plan.chunk_bos,
        plan.chunk_len, None, D**-0.5, config, plan=plan, scores=x["scores"],
    )  # fmt: skip


def intra_rows(T: int, x) -> list[dict]:
    """Intra with and without the scores, and the scores kernel alone, at length ``T``."""
    from longsparse.bench.gdn import HV, D, H
    from longsparse.bench.timing import benchmark
    from longsparse.ops.gdn import SparseGDNConfig
    from longsparse.ops.gdn.fused import sparse_gdn_fwd_kernel_scores
    from longsparse.ops.gdn.intra import intra_forward

    plan, cfg = x["plan"], SparseGDNConfig()
    bos, clen, NC = plan.chunk_bos, plan.chunk_len, plan.layout.NC
    args = (x["k"], x["v"], x["g"], x["beta"], bos, clen)
    alone = torch.full_like(x["scores"], float("nan"))

    def intra(**kw):
        return intra_forward(*args, max_registers=cfg.intra_registers, **kw)

    def scores_kernel():
        sparse_gdn_fwd_kernel_scores[(NC, H)](x["q"], x["k"], x["g"], alone, bos, clen, H=H, HV=HV, K=D, IEEE=False)

    ct0, gamma0, score0 = intra()
    scores_kernel()
    fused_scores = torch.full_like(x["scores"], float("nan"))
    ct1, gamma1, score1 = intra(q=x["q"], scores=fused_scores)
    torch.cuda.synchronize()
    row = {
        "T": T,
        "what": "intra",
        "coefficients_equal": all(torch.equal(a, b) for a, b in ((ct0, ct1), (gamma0, gamma1), (score0, score1))),
        "scores_equal": bool(torch.equal(alone, fused_scores)),
        "intra_ms": benchmark(intra).median_ms,
        "scores_kernel_ms": benchmark(scores_kernel).median_ms,
        "intra_with_scores_ms": benchmark(lambda: intra(q=x["q"], scores=fused_scores)).median_ms,
    }
    print(row, flush=True)
    return [row]


def variant_rows(name: str, lengths: list[int], with_intra: bool) -> list[dict]:
    from longsparse.bench.timing import benchmark
    from longsparse.ops.gdn import SparseGDNConfig, walk_gluon

    block_v, switches = VARIANTS[name]
    for switch, value in switches.items():
        if not hasattr(walk_gluon, switch):
            raise AttributeError(f"walk_gluon has no switch {switch} in this tree")
        setattr(walk_gluon, switch, value)
    triton_cfg = SparseGDNConfig(walk_kernel="triton", walk_scores="stored")
    gluon_cfg = SparseGDNConfig(walk_kernel="gluon", block_v=block_v)
    rows = []
    for n, T in enumerate(lengths):
        x = prepare(T)
        if with_intra:
            rows += intra_rows(T, x)
        for how in ("selector",) + (FORCED if n == 0 else ()):
            selection = forced_selection(x["sel"], how)
            row = {"T": T, "what": "walk", "variant": name, "mask": how,
                   "selected_fraction": selection.mask.float().mean().item()}  # fmt: skip
            try:
                o_t, s_t = main_pass(x, selection, triton_cfg)
                o_g, s_g = main_pass(x, selection, gluon_cfg)
                torch.cuda.synchronize()
                row.update(
                    o_vs_triton=rel(o_g, o_t), ht_vs_triton=rel(s_g, s_t),
                    finite=bool(o_g.isfinite().all() and s_g.isfinite().all()),
                )  # fmt: skip
                if how == "selector":
                    timed = (("main_ms", gluon_cfg), ("main_triton_ms", triton_cfg))[: 2 if name == "base" else 1]
                    for key, cfg in timed:
                        row[key] = benchmark(lambda cfg=cfg, x=x, s=selection: main_pass(x, s, cfg)).median_ms
            except Exception as exc:  # a failing variant is a row; an illegal address ends this process only
                row["error"] = repr(exc)[:600]
            rows.append(row)
            print(row, flush=True)
        del x
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,32768,131072")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--one", help="run this variant in this process and write its rows to --json")
    ap.add_argument("--json")
    args = ap.parse_args()
    lengths = [int(t) for t in args.lengths.split(",")]
    if args.one:
        rows = variant_rows(args.one, lengths, with_intra=args.one == "base")
        with open(args.json, "w") as f:
            json.dump(rows, f)
        sys.exit(0)
    rows = []
    for name in args.variants.split(","):
        part = os.path.join(OUT, f"walk_variant_{name}.part.json")
        cmd = [sys.executable, __file__, "--one", name, "--json", part, "--lengths", args.lengths]
        done = subprocess.run(cmd)
        if done.returncode == 0 and os.path.exists(part):
            rows += json.load(open(part))
            os.remove(part)
        else:
            rows.append({"variant": name, "error": f"process exited {done.returncode}"})
    with open(os.path.join(OUT, "walk_variants.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'variant':18} {'T':>7} {'mask':9} {'main ms':>8} {'o err':>9} {'ht err':>9}")
    for r in rows:
        if r.get("what") == "walk":
            ms = f"{r['main_ms']:.3f}" if "main_ms" in r else ""
            print(f"{r['variant']:18} {r['T']:7d} {r['mask']:9} {ms:>8} {r.get('o_vs_triton', float('nan')):9.2e} "
                  f"{r.get('ht_vs_triton', float('nan')):9.2e} {r.get('error', '')[:60]}")  # fmt: skip
        elif r.get("what") == "intra":
            print(r)
        else:
            print(r)
