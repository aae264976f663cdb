"""The SparseGDN intra kernel (kept blocks, 4 warps) at register caps 128 (the default) / 112 / 96 / 80 on the H200,
Qwen3.5-4B GDN geometry, B = 1, T = 32K and 128K: median time and whether the coefficients, decays and tail scores
are bit-equal to the uncapped build's. Fewer registers let more programs share an SM (128: 4, 96: 5, 80: 6) at the
price of spills (offline sm_90 builds: 84 B at 128, 312 B at 96, 576 B at 80).

    PYTHONPATH=src python benchmarks/tuning/2026-11-30/intra_caps.py   # JSON to $OUT/intra_caps.json
"""
import json
import os

import torch

from longsparse.bench.gdn import D, H, HV, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import launch
from longsparse.ops.gdn.intra import intra_forward

OUT = os.environ.get("OUT", ".")
rows = []
for T in (32768, 131072):
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    bos, clen = plan.chunk_bos, plan.chunk_len
    kf, vf = k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV), beta.reshape(T, HV)
    ref = intra_forward(kf, vf, gf, bf, bos, clen, max_registers=None)
    for cap in (None, 128, 112, 96, 80):

        def run(cap=cap):
            return intra_forward(kf, vf, gf, bf, bos, clen, max_registers=cap)

        out = run()
        row = {"T": T, "cap": cap, "equal": all(torch.equal(a, b) for a, b in zip(out, ref)),
               "ms": benchmark(run).median_ms}
        rows.append(row)
        print(row, flush=True)
json.dump(rows, open(os.path.join(OUT, "intra_caps.json"), "w"), indent=1)
