"""CPU emulation (as ../2026-12-02c/emulate_fp16.py): intra's fp16 block solve made safe for any key norm and β by
a similarity scaling instead of a branch to the tf32 solve. With ``ρ = max β · max |k|²`` over the chunk (the bound
``F16_SOLVE_BOUND`` tests today) and ``s = min(1, F16_SOLVE_BOUND / ρ)``, the chain inverts
``I + L' = S (I + L) S⁻¹``, ``S = diag(s^r)`` over a block's rows ``r`` (``L'_ij = L_ij s^{i−j}``), whose terms obey
the fp16 bound of ``ρ' = s ρ <= F16_SOLVE_BOUND``, and ``D = S⁻¹ D' S`` (``D_ij = D'_ij s^{j−i}``) in fp32. On
L2-normalised keys and β <= 1, ``s = 1`` and nothing changes (bit for bit). Compared against the op's two paths —
fp16 chain (where the bound holds) and tf32 chain (the fallback) — on keys of norm 1, 1.5, 2 and 4 and β up to 1 and
2, float64 references; errors of the kept blocks after bf16 storage, the largest operand any fp16 product reads.
``PYTHONPATH=src:. python benchmarks/tuning/2026-12-03c/emulate_scaled_fp16.py`` (~1 min; output in
``emulate_scaled_fp16.txt``)."""

import torch
from tests.ops.gdn.helpers import make_gdn_inputs, spread_decays

BOUND = 1.03125


def tf32(x):
    return (x.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def f16(x):
    return x.float().half().float()


def bf16(x):
    return x.float().bfloat16().float()


def mm(a, b, rnd):
    return (rnd(a).double() @ rnd(b).double()).float()


def chain(L, I, rnd, peaks):
    L2 = mm(L, L, rnd)
    A = mm(I - L, I + L2, rnd)
    L4 = mm(L2, L2, rnd)
    L8 = mm(L4, L4, rnd)
    D = mm(mm(A, I + L4, rnd), I + L8, rnd)
    D = D + mm(D, I - mm(I + L, D, rnd), rnd)  # the refinement step
    peaks.append(max(x.abs().max().item() for x in (L2, L4, L8, A, D)))
    return D


T, H, HV = 64 * 40, 16, 32
q, k, v, _, beta0, _ = make_gdn_inputs(1, T, H, HV, 128, 128, dtype=torch.float32, with_state=True, n_states=1, seed=0)
g = spread_decays(1, T, HV, dtype=torch.float32, seed=0)
r = torch.arange(16, dtype=torch.float64)
offset = r[:, None] - r[None, :]  # i − j
for norm, beta_max in ((1.0, 1.0), (1.5, 1.0), (2.0, 1.0), (4.0, 1.0), (1.0, 2.0), (2.0, 2.0)):
    kk = bf16(torch.nn.functional.normalize(k, dim=-1) * norm)
    beta = beta0 * beta_max
    kh = kk.repeat_interleave(HV // H, dim=2)[0].transpose(0, 1).reshape(HV, T // 64, 4, 16, 128).double()
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
    # the kernel's bound: max β of the value head's chunk times the largest squared key norm of the chunk
    key_norm2 = gram.diagonal(dim1=-2, dim2=-1).amax(dim=(-2, -1))  # [HV, NC]
    rho = bb.amax(dim=(-2, -1)) * key_norm2
    s = torch.clamp(BOUND / rho, max=1.0)[..., None, None, None]  # [HV, NC, 1, 1, 1]

    def rel(x, ref):
        return ((x.double() - ref).norm() / ref.norm()).item()

    out = [f"|k| {norm}, β <= {beta_max}: ρ up to {rho.max():.2f}, max|D| {D64.abs().max():.3g}"]
    Lf, If = L.float(), I.float()
    for name in ("tf32 chain (today's fallback)", "fp16 chain (today where ρ <= bound)", "scaled fp16 chain"):
        peaks = []
        if name.startswith("tf32"):
            D = chain(Lf, If, tf32, peaks)
        elif name.startswith("fp16"):
            D = chain(Lf, If, f16, peaks)
        else:
            scale = s.double() ** offset  # s^{i−j} on and below the diagonal
            Dp = chain((L * scale).float(), If, f16, peaks)
            D = (Dp.double() * torch.where(offset >= 0, s.double() ** (-offset), 0.0)).float()
        Ct = D * bb[..., None, :].float()
        Ef = E.float()
        Eh = tf32(Ef)
        DE = mm(D[:, :, 1:], Eh, tf32) + mm(D[:, :, 1:], Ef - Eh, tf32)
        Cs = -mm(DE, Ct[:, :, :-1], tf32)
        finite = bool(torch.isfinite(Ct).all() and torch.isfinite(Cs).all())
        out.append(
            f"{name:38s}: diag {rel(bf16(Ct), Ct64):.2e} sub {rel(bf16(Cs), Cs64):.2e} finite {finite}; "
            f"peak fp16/tf32 operand {max(peaks):.3g}"
        )
    print("\n   ".join(out), flush=True)
