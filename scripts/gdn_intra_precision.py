"""Time the SparseGDN intra stage — on whole 64×64 tiles or on the kept 16×16 blocks, 3-pass or plain tf32, 4 or 8
warps — and the error of its coefficients and tail scores against the fp32 (IEEE) solve of the same inputs. Needs a
CUDA GPU.

    PYTHONPATH=src python scripts/gdn_intra_precision.py [--tokens 131072] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--out", default=None, help="folder for intra_precision.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton
    from tests.ops.gdn.test_sparse_kernels import _qwen_inputs

    from longsparse.ops.gdn.intra import intra_forward
    from longsparse.ops.gdn.layout import build_layout

    T = args.tokens
    (q, k, v, g, beta, *_), cu = _qwen_inputs([T])
    layout = build_layout(1, T, cu, "cuda")
    bos, lens = layout.token_index[:, 0].int(), layout.chunk_len.int()
    k0, v0, g0, b0 = k[0], v[0], g[0].float(), beta[0].float()
    ref_ct, _, ref_score = intra_forward(k0.float(), v0.float(), g0, b0, bos, lens)

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    rows = []
    for blocks, warps, tf32x3 in ((True, 4, False), (True, 8, False), (True, 4, True), (False, 4, False)):

        def run(warps=warps, tf32x3=tf32x3, blocks=blocks):
            return intra_forward(k0, v0, g0, b0, bos, lens, num_warps=warps, tf32x3=tf32x3, blocks=blocks)

        ct, _, score = run()
        row = {
            "kernel": "blocks" if blocks else "tiles",
            "warps": warps,
            "products": "tf32x3" if tf32x3 else "tf32",
            "ms": round(triton.testing.do_bench(run, warmup=5, rep=50), 3),
            "ct_rel_vs_fp32": rel(ct, ref_ct),
            "score_rel_vs_fp32": rel(score, ref_score),
        }
        rows.append(row)
        print(row, flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "intra_precision.json"), "w") as f:
            json.dump({"tokens": T, "device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
