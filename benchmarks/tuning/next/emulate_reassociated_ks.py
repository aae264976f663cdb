"""Rounding error of the walk's state chain with ``K S`` re-associated, emulated on the CPU against float64.

One value head, T = 64 · 256 tokens (256 chunks), K = 128, one V tile of 64; keys and values rounded to bf16 as the
kernel reads them, the exact intra coefficients ``Ct = M⁻¹ diag(β)`` (``M = I + A_Δ``) in float64, then bf16.
Per chunk c, bf16 operands and fp32 accumulation (emulated: float32 products of bf16-rounded operands):

    today:          KS_c = K_c bf16(S_c)
    re-associated:  KS_{c+1} = e^{γ_c} K_{c+1} bf16(S_c) + sel_c bf16(K_{c+1} K_cᵀ) Ud_c       (KS_0 as today)
    both:           W = V − sel · e^G ⊙ KS,  U = Ct bf16(W),  Ud = bf16(U ⊙ e^{γ − G}),
                    S_{c+1} = e^γ S_c + sel · Kᵀ Ud   (fp32 state)

with γ_c = G_c[63]. Both are compared with the same chain in float64 (float64 Ct, no rounding): relative Frobenius
error of all chunks' U stacked, the worst chunk's U, and the final state. Cases: random or alike unit keys
(``normalize(base + 0.1 · noise)``, one base, both N(0, 1) per entry), ``g = logsigmoid(N(shift, 1))`` for shift
4 and 2, ~30 % or all chunks selected; ``v ~ N(0, 1)``, ``β = sigmoid(N(0, 1))``, S_0 = 0.

    PYTHONPATH=src python3 benchmarks/tuning/next/emulate_reassociated_ks.py     # writes emulate_reassociated_ks.txt
"""

import itertools
from pathlib import Path

import torch
import torch.nn.functional as F

from longsparse.ops.gdn.spec.intra import full_solve

NC, L, K, BV = 256, 64, 128, 64
f64, f32 = torch.float64, torch.float32


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def make_case(keys: str, shift: float, frac: float, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    if keys == "random":
        k = randn(NC, L, K)
    else:
        k = randn(K) + 0.1 * randn(NC, L, K)
    k = bf16(F.normalize(k, dim=-1))
    v = bf16(randn(NC, L, BV))
    g = F.logsigmoid(randn(NC, L) + shift)
    beta = torch.sigmoid(randn(NC, L))
    sel = torch.rand(NC, generator=gen) < frac
    G = g.cumsum(-1)
    tri = torch.ones(L, L, dtype=torch.bool).tril(-1)
    A = beta[:, :, None] * (k @ k.mT) * torch.where(tri, G[:, :, None] - G[:, None, :], -torch.inf).exp()
    M = torch.eye(L, dtype=f64) + A
    Ct = torch.linalg.solve_triangular(M, torch.diag_embed(beta), upper=False, unitriangular=True)
    spec = full_solve(k, torch.eye(L, dtype=f64).expand(NC, L, L), beta, G).U  # = M⁻¹ diag(β) I
    assert rel(spec, Ct) < 1e-12, rel(spec, Ct)
    return dict(k=k, v=v, G=G, sel=sel, Ct=Ct)


def walk(case: dict, form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``form`` ∈ {"ref", "today", "reassoc"} -> (U [NC, 64, BV], final S [K, BV])."""
    dt = f64 if form == "ref" else f32
    r = (lambda x: x) if form == "ref" else bf16
    k, v, G = case["k"].to(dt), case["v"].to(dt), case["G"].to(dt)
    Ct = case["Ct"] if form == "ref" else bf16(case["Ct"].to(f32))
    S = torch.zeros(K, BV, dtype=dt)
    prev = None
    Us = []
    for c in range(NC):
        sel = bool(case["sel"][c])
        if form == "reassoc" and prev is not None:
            k_p, ud_p, sel_p, gam_p, s_p = prev
            ks = gam_p.exp() * (k[c] @ s_p)
            if sel_p:
                ks = ks + r(k[c] @ k_p.mT) @ ud_p
        else:
            ks = k[c] @ r(S)
        w = v[c] - (G[c].exp()[:, None] * ks if sel else 0.0)
        u = Ct[c] @ r(w)
        gam = G[c, -1]
        ud = r(u * (gam - G[c]).exp()[:, None])
        Us.append(u)
        prev = (k[c], ud, sel, gam, r(S))
        S = gam.exp() * S + (k[c].mT @ ud if sel else 0.0)
    return torch.stack(Us), S


def rel(x: torch.Tensor, ref: torch.Tensor, dims=None) -> torch.Tensor:
    return (x.double() - ref).norm(dim=dims) / ref.norm(dim=dims)


def main():
    head = f"{'keys':7} {'shift':>5} {'sel':>4} | {'U today':>9} {'U reas.':>9} {'x':>5} | "
    head += f"{'Umax tod.':>9} {'Umax rea.':>9} {'x':>5} | {'S today':>9} {'S reas.':>9} {'x':>5}"
    lines = [head, "-" * len(head)]
    for seed, (keys, shift, frac) in enumerate(itertools.product(("random", "alike"), (4.0, 2.0), (0.3, 1.0))):
        case = make_case(keys, shift, frac, seed)
        U_ref, S_ref = walk(case, "ref")
        row = f"{keys:7} {shift:5.0f} {case['sel'].float().mean().item():4.2f} |"
        for metric in ("U", "Umax", "S"):
            errs = []
            for form in ("today", "reassoc"):
                U, S = walk(case, form)
                if metric == "U":
                    errs.append(rel(U, U_ref).item())
                elif metric == "Umax":
                    errs.append(rel(U, U_ref, (-2, -1)).max().item())
                else:
                    errs.append(rel(S, S_ref).item())
            row += f" {errs[0]:9.2e} {errs[1]:9.2e} {errs[1] / errs[0]:5.2f} |"
        lines.append(row.rstrip(" |"))
    lines.append("relative Frobenius error against float64; x = re-associated / today; Umax: worst chunk's U")
    text = "\n".join(lines)
    print(text)
    Path(__file__).with_suffix(".txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
