"""CPU emulation (as ../2026-12-02/intra_precision/emulate_chain.py): intra's block solve with fp16 operands (rounded
to nearest, fp32 accumulation: the m16n8k16 MMA) against the op's tf32 chain (operands truncated) with its refinement
step and split sub-diagonal product, and bf16 operands, on keys of five spreads; float64 references. Errors of the
kept blocks after their bf16 storage (and before it), and the largest operand any product reads (fp16's range is
65504). ``PYTHONPATH=src:. python benchmarks/tuning/2026-12-02c/emulate_fp16.py`` (~2 min); output in ``emulate_fp16.txt``."""

import torch
from tests.ops.gdn.helpers import make_gdn_inputs, spread_decays
from tests.ops.gdn.test_sparse_kernels import _correlated_keys


def tf32(x):
    i = x.float().contiguous().view(torch.int32)
    i = i & ~0x1FFF
    return i.view(torch.float32)


def f16(x):
    return x.float().half().float()


def bf16(x):
    return x.float().bfloat16().float()


def mm(a, b, rnd):
    return (rnd(a).double() @ rnd(b).double()).float()


T = 64 * 40
H = 16
HV = 32
q, k, v, _, beta, h0 = make_gdn_inputs(1, T, H, HV, 128, 128, dtype=torch.float32, with_state=True, n_states=1, seed=0)
g = spread_decays(1, T, HV, dtype=torch.float32, seed=0)
for spread in (None, 0.3, 0.1, 0.03, 0.01):
    kk = k.bfloat16() if spread is None else _correlated_keys(k.bfloat16(), spread)
    kh = kk.float().repeat_interleave(HV // H, dim=2)[0].transpose(0, 1).reshape(HV, T // 64, 4, 16, 128).double()
    G = g[0].T.reshape(HV, T // 64, 64).double().cumsum(-1).view(HV, T // 64, 4, 16)
    bb = beta[0].T.reshape(HV, T // 64, 4, 16).double()
    gram = kh @ kh.transpose(-1, -2)
    strict = torch.tril(torch.ones(16, 16, dtype=torch.bool), -1)
    L = torch.where(strict, bb[..., :, None] * gram * torch.exp(G[..., :, None] - G[..., None, :]), 0.0)
    I = torch.eye(16, dtype=torch.float64)
    D64 = torch.linalg.inv(I + L)
    Ct64 = D64 * bb[..., None, :]
    gsub = kh[:, :, 1:] @ kh[:, :, :-1].transpose(-1, -2)
    E = bb[:, :, 1:, :, None] * gsub * torch.exp(G[:, :, 1:, :, None] - G[:, :, :-1, None, :])
    Cs64 = -(D64[:, :, 1:] @ E @ Ct64[:, :, :-1])

    def rel(x, r):
        return ((x.double() - r).norm() / r.norm()).item()

    out = [f"spread={spread}: max|L| {L.abs().max():.3f} max|D| {D64.abs().max():.1f}"]
    for name, rc, refine, rs, split in (
        ("tf32 + refine + split (today)", tf32, True, tf32, True),
        ("tf32 + refine", tf32, True, tf32, False),
        ("fp16 chain", f16, False, f16, False),
        ("fp16 + refine", f16, True, f16, False),
        ("fp16 + refine + split", f16, True, f16, True),
        ("fp16 chain+refine, tf32 split sub", f16, True, tf32, True),
        ("bf16 + refine + split", bf16, True, bf16, True),
    ):
        Lf = L.float()
        If = I.float()
        L2 = mm(Lf, Lf, rc)
        A = mm(If - Lf, If + L2, rc)
        L4 = mm(L2, L2, rc)
        L8 = mm(L4, L4, rc)
        D = mm(mm(A, If + L4, rc), If + L8, rc)
        peak = max(x.abs().max().item() for x in (L2, L4, L8, A, D))
        if refine:
            D = D + mm(D, If - mm(If + Lf, D, rc), rc)
        Ct = D * bb[..., None, :].float()
        Ef = E.float()
        if split:
            Eh = rs(Ef)
            El = Ef - Eh  # tf32: truncation; fp16: round to nearest
            DE = mm(D[:, :, 1:], Eh, rs) + mm(D[:, :, 1:], El, rs)
        else:
            DE = mm(D[:, :, 1:], Ef, rs)
        Cs = -mm(DE, Ct[:, :, :-1], rs)
        out.append(
            f"{name:30s}: diag {rel(bf16(Ct), Ct64):.1e} sub {rel(bf16(Cs), Cs64):.1e} "
            f"(before bf16 storage {rel(Ct, Ct64):.1e} / {rel(Cs, Cs64):.1e}); peak operand {peak:.0f}"
        )
    print("\n   ".join(out), flush=True)
