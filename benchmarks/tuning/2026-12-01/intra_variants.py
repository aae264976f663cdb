"""The intra kernel's forms side by side on the H200, as the op runs it on the Gluon path (stored scores and dense Ct
in [NC, HV, 128, 64] tiles, no kept blocks, 128 registers): ``SHIFT_PREV`` (block b − 1's Ct taken from block
b − 1's program lanes by ``tl.gather`` instead of its inverse recomputed from inputs loaded one block back) ×
``TAIL_BATCHED`` (the tail score's products in the blocks' own layout instead of block 3's coefficients moved into
a 2-D tile). Times per form at 32K and 128K (B = 1, Qwen3.5-4B geometry) and the largest difference of each output
from the first form's. Writes ``$OUT/intra_variants.json``."""

import json
import os

import torch

from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, intra, launch

OUT = os.environ.get("OUT", ".")
FORMS = [(False, False), (False, True), (True, False), (True, True)]


def run(T: int) -> dict:
    q, k, v, g, beta, *_ = make_inputs(1, T, shift=4.0)
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV).contiguous(), beta.reshape(T, HV).contiguous()
    plan = launch.plan_launch(1, T, None, q.device)
    NC = plan.layout.NC
    cap = SparseGDNConfig().intra_registers
    row, outs = {"T": T}, {}
    for shift, tail in FORMS:
        name = f"shift{int(shift)}_tail{int(tail)}"
        tiles = torch.empty(NC, HV, 128, 64, dtype=q.dtype, device=q.device)
        gamma = torch.empty(NC, HV, dtype=torch.float32, device=q.device)
        score = torch.empty_like(gamma)

        def call(tiles=tiles, gamma=gamma, score=score, shift=shift, tail=tail):
            intra.sparse_gdn_fwd_kernel_intra_blocks[(NC, H)](
                kf, vf, gf, bf, tiles, gamma, score, plan.chunk_bos, plan.chunk_len, qf, tiles,
                H=H, HV=HV, K=D, V=D, IEEE=False, TF32X3=False, STORE_SCORES=True, SCORE_ROWS=128,
                STORE_KEPT=False, SHIFT_PREV=shift, TAIL_BATCHED=tail, TAIL_BV=32, num_warps=4, maxnreg=cap,
            )  # fmt: skip

        call()
        torch.cuda.synchronize()
        outs[name] = (tiles.float(), gamma.clone(), score.clone())
        row[f"{name}_ms"] = benchmark(call).median_ms
    base = outs["shift0_tail0"]
    for name, (tiles, gamma, score) in outs.items():
        row[f"{name}_tiles_maxrel"] = ((tiles - base[0]).abs().max() / base[0].abs().max()).item()
        row[f"{name}_score_maxrel"] = ((score - base[2]).abs().max() / base[2].abs().max()).item()
        row[f"{name}_gamma_equal"] = bool(torch.equal(gamma, base[1]))
    print(row, flush=True)
    return row


if __name__ == "__main__":
    rows = [run(T) for T in (32768, 131072)]
    with open(os.path.join(OUT, "intra_variants.json"), "w") as f:
        json.dump(rows, f, indent=1)
