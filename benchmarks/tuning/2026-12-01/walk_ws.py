"""The warp-specialised Gluon walk (``walk_gluon.WARP_SPECIALISED``) against the single-warpgroup Gluon walk and
the Triton walk on the H200. Qwen3.5-4B GDN geometry, B = 1; one process per form (an illegal address poisons only
its own CUDA context). Inputs, intra and the selection as ``walk_variants.py`` prepares them.

Per form: the main pass (entry + walk, scores given) at the shortest length under the selector's mask and forced
masks (all, none, alternating, random halves), output and final state against the Triton walk; at every length
under the selector's mask, the same errors and the main pass's time (the single form also times the Triton walk).

    PYTHONPATH=src python benchmarks/tuning/2026-12-01/walk_ws.py     # JSON to $OUT/walk_ws.json
"""

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from walk_variants import FORCED, forced_selection, main_pass, prepare, rel  # noqa: E402

OUT = os.environ.get("OUT", ".")
FORMS = {"single": False, "ws": True}  # walk_gluon.WARP_SPECIALISED


def form_rows(name: str, lengths: list[int]) -> list[dict]:
    from longsparse.bench.timing import benchmark
    from longsparse.ops.gdn import SparseGDNConfig, walk_gluon

    walk_gluon.WARP_SPECIALISED = FORMS[name]
    triton_cfg = SparseGDNConfig(walk_kernel="triton", walk_scores="stored")
    gluon_cfg = SparseGDNConfig(walk_kernel="gluon", block_v=64)
    rows = []
    for n, T in enumerate(lengths):
        x = prepare(T)
        plain = x["scores"]
        # the Gluon walk reads [NC, HV, 128, 64]: each chunk's scores, then its dense Ct (what intra stores for it)
        gluon_scores = torch.cat([plain, walk_gluon.dense_coefficients(x["ct"])], dim=2)

        def run(selection, cfg, x=x, plain=plain, tiles=gluon_scores):
            x["scores"] = plain if cfg is triton_cfg else tiles
            return main_pass(x, selection, cfg)

        for how in ("selector",) + (FORCED if n == 0 else ()):
            selection = forced_selection(x["sel"], how)
            row = {"T": T, "form": name, "mask": how, "selected_fraction": selection.mask.float().mean().item()}
            try:
                o_t, s_t = run(selection, triton_cfg)
                o_g, s_g = run(selection, gluon_cfg)
                torch.cuda.synchronize()
                row.update(
                    o_vs_triton=rel(o_g, o_t), ht_vs_triton=rel(s_g, s_t),
                    finite=bool(o_g.isfinite().all() and s_g.isfinite().all()),
                )  # fmt: skip
                if how == "selector":
                    timed = (("main_ms", gluon_cfg), ("main_triton_ms", triton_cfg))[: 2 if name == "single" else 1]
                    for key, cfg in timed:
                        row[key] = benchmark(lambda cfg=cfg, s=selection: run(s, cfg)).median_ms
            except Exception as exc:
                row["error"] = repr(exc)[:600]
            rows.append(row)
            print(row, flush=True)
        del x, plain, gluon_scores
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,32768,131072")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--one")
    ap.add_argument("--json")
    args = ap.parse_args()
    lengths = [int(t) for t in args.lengths.split(",")]
    if args.one:
        with open(args.json, "w") as f:
            json.dump(form_rows(args.one, lengths), f)
        sys.exit(0)
    rows = []
    for name in args.forms.split(","):
        part = os.path.join(OUT, f"walk_ws_{name}.part.json")
        done = subprocess.run([sys.executable, __file__, "--one", name, "--json", part, "--lengths", args.lengths])
        if done.returncode == 0 and os.path.exists(part):
            rows += json.load(open(part))
            os.remove(part)
        else:
            rows.append({"form": name, "error": f"process exited {done.returncode}"})
    with open(os.path.join(OUT, "walk_ws.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'form':7} {'T':>7} {'mask':9} {'main ms':>8} {'triton ms':>9} {'o err':>9} {'ht err':>9}")
    for r in rows:
        ms = f"{r['main_ms']:.3f}" if "main_ms" in r else ""
        tm = f"{r['main_triton_ms']:.3f}" if "main_triton_ms" in r else ""
        print(
            f"{r.get('form', ''):7} {r.get('T', ''):>7} {r.get('mask', ''):9} {ms:>8} {tm:>9} "
            f"{r.get('o_vs_triton', float('nan')):9.2e} {r.get('ht_vs_triton', float('nan')):9.2e} {r.get('error', '')}"
        )
