"""Branch walk-gluon, on the H200: the Gluon walk's intermediate products against torch products of the same tiles,
to find which product goes wrong. One sequence of two chunks (T = 128), one segment, Qwen3.5-4B head geometry, BV =
64, grouped output, the mask forced to all chunks selected and to none; program 0 (value head 0, V tile 0) records
its first two chunks (``walk_gluon.run_walk(debug=...)``). The reference takes the same bf16-rounded operands as the
kernel (S, S_read, W, U, U ⊙ e^{γ − G}).

    PYTHONPATH=src python benchmarks/tuning/2026-12-01/walk_gluon_debug.py   # table; JSON to $OUT/walk_gluon_debug.json
"""

import json
import os

import torch

from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.ops.gdn import launch, walk_gluon
from longsparse.ops.gdn.fused import sparse_gdn_fwd_kernel_scores
from longsparse.ops.gdn.intra import intra_forward

OUT = os.environ.get("OUT", ".")
T, BV = 128, 64
SLOTS = {"Q S_read": 0, "K S": 1, "W": 2, "U": 3, "O (unscaled)": 4, "R": 5, "S after": 7}
bf = torch.bfloat16


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def reference(qf, kf, vf, gf, scores, ct_dense, selected):
    """Program 0's products on chunks 0 and 1 (grouped: chunk 1 reads chunk 0's would-be write R)."""
    S = torch.zeros(D, BV, device=qf.device)
    out = []
    R_prev = None
    for c in (0, 1):
        rows = slice(64 * c, 64 * c + 64)
        Kc, Qc, Vc = kf[rows, 0].float(), qf[rows, 0].float(), vf[rows, 0, :BV].float()
        A, Ct = scores[c, 0].float(), ct_dense[c, 0].float()
        G = gf[rows, 0].float().cumsum(0)
        gamma = G[-1]
        S_read = S if c == 0 else R_prev
        got = {"Q S_read": Qc @ S_read.to(bf).float()}
        if selected:
            got["K S"] = Kc @ S.to(bf).float()
            got["W"] = Vc - G.exp()[:, None] * got["K S"]
        W = got.get("W", Vc)
        U = Ct @ W.to(bf).float()
        R = gamma.exp() * S + Kc.T @ (U * (gamma - G).exp()[:, None]).to(bf).float()
        got["U"] = U
        got["O (unscaled)"] = G.exp()[:, None] * got["Q S_read"] + A @ U.to(bf).float()
        if selected or c == 0:  # formed: a selected chunk, or a group's even chunk
            got["R"] = R
        S = R if selected else gamma.exp() * S
        got["S after"] = S
        out.append(got)
        R_prev = R
    return out


def main():
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    dev = q.device
    plan = launch.plan_launch(1, T, None, dev)
    NC = plan.layout.NC
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf_ = g.reshape(T, HV), beta.reshape(T, HV)
    ct, gamma, score = intra_forward(kf, vf, gf, bf_, plan.chunk_bos, plan.chunk_len, max_registers=128)
    scores = torch.empty(NC, HV, 64, 64, dtype=q.dtype, device=dev)
    sparse_gdn_fwd_kernel_scores[(NC, H)](
        qf, kf, gf, scores, plan.chunk_bos, plan.chunk_len, H=H, HV=HV, K=D, IEEE=False
    )
    segs = launch.plan_segments(plan.lengths, HV * (D // BV), 132, dev, NC)  # one segment
    rows = []
    for case, selected in (("all selected", True), ("none selected", False)):
        mask = torch.full((1, H, NC), int(selected), dtype=torch.uint8, device=dev)
        o = torch.zeros_like(vf)
        ht = torch.zeros(1, HV, D, D, dtype=torch.float32, device=dev)
        dbg = torch.full((2, 9, 64, BV), float("nan"), device=dev)
        walk_gluon.run_walk(
            qf, kf, vf, gf, ct, mask, ht, ht, o, scores, ht, segs, plan.chunk_bos, plan.chunk_len, D**-0.5,
            P=H, CMAX=NC, block_v=BV, has_h0=False, has_entry=False, grouped=True, debug=dbg,
        )  # fmt: skip
        torch.cuda.synchronize()
        ref = reference(qf, kf, vf, gf, scores, walk_gluon.dense_coefficients(ct), selected)
        for c in (0, 1):
            for name, want in ref[c].items():
                slot = SLOTS[name]
                got = dbg[c].reshape(-1, BV)[64 * slot : 64 * slot + want.shape[0]]
                rows.append({"case": case, "chunk": c, "product": name, "rel": rel(got, want),
                             "got_norm": got.norm().item(), "want_norm": want.norm().item()})  # fmt: skip
                print(rows[-1], flush=True)
            o_got = o[64 * c : 64 * c + 64, 0, :BV].float()
            rows.append(
                {"case": case, "chunk": c, "product": "o stored", "rel": rel(o_got, D**-0.5 * ref[c]["O (unscaled)"])}
            )
            print(rows[-1], flush=True)
    json.dump(rows, open(os.path.join(OUT, "walk_gluon_debug.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
