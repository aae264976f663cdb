"""Timed on the H200 on 2026-12-02 (``intra_tail_reload.json``; needs ``intra-tail-reload.patch`` applied to
``1aa3a92``: the reload has since become unconditional): the intra kernel's two candidate trims against the form with
both off, as the op runs it on the Gluon path (tiles only) and on the Triton path (kept blocks):

* ``TAIL_RELOAD``: the tail score's block-3 coefficients read back from what the kernel just stored (after a
  barrier) instead of extracted from the batched blocks by two cross-warp reductions;
* ``FAST_EXP``: the decays ``e^{G_i − G_j}`` as one ``ex2.approx.ftz`` of base-2 log-decays instead of ``tl.exp``'s
  five instructions (its subnormal fix-up and the scaling by log2 e per element).

Offline builds (Triton 3.6, sm_90a, 128 registers), SASS instructions on the tiles path: both off 3,536 (0 B
spilled; main's build of the same operations 3,624); reload 3,256 (8 B); fast 3,304 (0); both 3,024 (8 B).
Interpreter: the reload bit-equal, the fp32 tests pass. Prints times and each form's largest differences from the
form with both off; writes ``$OUT/intra_tail_reload.json``."""

import json
import os

import torch

from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, intra, launch

OUT = os.environ.get("OUT", ".")


def run(T: int) -> dict:
    q, k, v, g, beta, *_ = make_inputs(1, T, shift=4.0)
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV).contiguous(), beta.reshape(T, HV).contiguous()
    plan = launch.plan_launch(1, T, None, q.device)
    NC = plan.layout.NC
    cap = SparseGDNConfig().intra_registers
    row = {"T": T}
    for kept in (False, True):
        outs = {}
        for reload, fast in ((False, False), (True, False), (False, True), (True, True)):
            name = f"kept{int(kept)}_reload{int(reload)}_fast{int(fast)}"
            tiles = torch.empty(NC, HV, 128 if not kept else 64, 64, dtype=q.dtype, device=q.device)
            ct = torch.empty(NC, HV, 7, 16, 16, dtype=q.dtype, device=q.device)
            gamma = torch.empty(NC, HV, dtype=torch.float32, device=q.device)
            score = torch.empty_like(gamma)

            def call(tiles=tiles, ct=ct, gamma=gamma, score=score, kept=kept, reload=reload, fast=fast):
                intra.sparse_gdn_fwd_kernel_intra_blocks[(NC, H)](
                    kf, vf, gf, bf, ct if kept else tiles, gamma, score, plan.chunk_bos, plan.chunk_len, qf, tiles,
                    H=H, HV=HV, K=D, V=D, IEEE=False, TF32X3=False, STORE_SCORES=True,
                    SCORE_ROWS=tiles.shape[2], STORE_KEPT=kept, TAIL_RELOAD=reload, FAST_EXP=fast, num_warps=4,
                    maxnreg=cap,
                )  # fmt: skip

            call()
            torch.cuda.synchronize()
            outs[name] = (gamma.clone(), score.clone(), tiles.float(), ct.float())
            row[f"{name}_ms"] = benchmark(call).median_ms
        base = outs[f"kept{int(kept)}_reload0_fast0"]
        for name, out in outs.items():  # largest difference of gamma, score, tiles, ct from the form with both off
            pairs = list(zip(out, base))[: 4 if kept else 3]  # ct is written only with the kept blocks
            row[f"{name}_maxrel"] = [((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item() for a, b in pairs]
    print(row, flush=True)
    return row


if __name__ == "__main__":
    rows = [run(T) for T in (32768, 131072)]
    with open(os.path.join(OUT, "intra_tail_reload.json"), "w") as f:
        json.dump(rows, f, indent=1)
