"""The stored-scores kernel (`sparse_gdn_fwd_kernel_scores`, one program per (chunk, head pair)) at 2 / 4 / 8 warps
on the H200, Qwen3.5-4B geometry, B = 1; each output compared with the 4-warp one (bit-equal expected: the same
products, another thread layout).

    PYTHONPATH=src python benchmarks/tuning/2026-12-01/scores_warps.py   # JSON to $OUT/scores_warps.json
"""

import json
import os

import torch

from longsparse.bench.gdn import D, H, HV, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import launch
from longsparse.ops.gdn.fused import sparse_gdn_fwd_kernel_scores

OUT = os.environ.get("OUT", ".")
rows = []
for T in (32768, 131072):
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    NC = plan.layout.NC
    qf, kf, gf = q.reshape(T, H, D), k.reshape(T, H, D), g.reshape(T, HV)
    ref = None
    for warps in (4, 2, 8):
        scores = torch.empty(NC, HV, 64, 64, dtype=q.dtype, device=q.device)

        def call(scores=scores, warps=warps):
            sparse_gdn_fwd_kernel_scores[(NC, H)](
                qf, kf, gf, scores, plan.chunk_bos, plan.chunk_len, H=H, HV=HV, K=D, IEEE=False, num_warps=warps
            )

        call()
        torch.cuda.synchronize()
        ref = scores.clone() if ref is None else ref
        ms = benchmark(call).median_ms
        written = scores.numel() * scores.element_size() + 2 * qf.numel() * qf.element_size()
        rows.append({"T": T, "warps": warps, "ms": ms, "equal_to_4_warps": bool(torch.equal(scores, ref)),
                     "gbps": written / ms / 1e6})
        print(rows[-1], flush=True)
    json.dump(rows, open(os.path.join(OUT, "scores_warps.json"), "w"), indent=1)
