"""CPU emulation of intra's block solve on keys correlated around one direction per head (the GPU tests' inputs,
one 2,560-token sequence): each tensor-core product as an exact product of operands truncated to tf32 (as the
H200's tf32 MMA reads fp32 registers), fp32 results, against the float64 block inverse D_b and sub-diagonal
coefficient C_{b,b-1} = -D_b E_b D_{b-1} (both times β). Shows that the sub-diagonal error comes from D's (the
sub-diagonal coefficient is ~1e-6 of its factors' norms, so D's error is amplified), that every product of the
chain contributes, and that one Newton step D + D (I - (I + L) D) in tf32 takes the chain to the level of the bf16
storage. ``PYTHONPATH=src:. python emulate_chain.py`` (~1 min); output in ``emulate_chain.txt``."""
import torch
from tests.ops.gdn.helpers import make_gdn_inputs, spread_decays
from tests.ops.gdn.test_sparse_kernels import _correlated_keys
def tf32(x):
    i = x.float().contiguous().view(torch.int32); i = i & ~0x1FFF; return i.view(torch.float32)
def tf32_rn(x):
    i = x.float().contiguous().view(torch.int32); i = (i + 0x1000) & ~0x1FFF; return i.view(torch.float32)
def f32(x): return x.float()
def mm(a, b, rnd): return (rnd(a).double() @ rnd(b).double()).float()
T=64*40; H=16; HV=32
q, k, v, _, beta, h0 = make_gdn_inputs(1, T, H, HV, 128, 128, dtype=torch.float32, with_state=True, n_states=1, seed=0)
g = spread_decays(1, T, HV, dtype=torch.float32, seed=0)
for spread in (None, 0.3, 0.1):
    kk = k.bfloat16() if spread is None else _correlated_keys(k.bfloat16(), spread)
    kh = kk.float().repeat_interleave(HV // H, dim=2)[0].transpose(0, 1).reshape(HV, T // 64, 4, 16, 128).double()
    G = g[0].T.reshape(HV, T // 64, 64).double().cumsum(-1).view(HV, T // 64, 4, 16)
    bb = beta[0].T.reshape(HV, T // 64, 4, 16).double()
    gram = kk_ = kh @ kh.transpose(-1, -2)
    strict = torch.tril(torch.ones(16, 16, dtype=torch.bool), -1)
    L = torch.where(strict, bb[..., :, None] * gram * torch.exp(G[..., :, None] - G[..., None, :]), 0.0)
    I = torch.eye(16, dtype=torch.float64)
    D64 = torch.linalg.inv(I + L)
    Ct64 = D64 * bb[..., None, :]
    gsub = kh[:, :, 1:] @ kh[:, :, :-1].transpose(-1, -2)
    E = bb[:, :, 1:, :, None] * gsub * torch.exp(G[:, :, 1:, :, None] - G[:, :, :-1, None, :])
    Cs64 = -(D64[:, :, 1:] @ E @ Ct64[:, :, :-1])
    def rel(x, r): return ((x.double() - r).norm() / r.norm()).item()
    out = [f"spread={spread}: |Cs|/(|D||E||Ct|) = {Cs64.norm().item() / (D64[:,:,1:].norm() * E.norm() * Ct64.norm()).item() * 1e3:.3g}e-3"]
    for name, rc, rs in (("tf32/tf32", tf32, tf32), ("tf32/fp32sub", tf32, f32), ("fp32/tf32sub", f32, tf32), ("fp32/fp32", f32, f32)):
        Lf = L.float(); If = I.float()
        L2 = mm(Lf, Lf, rc); A = mm(If - Lf, If + L2, rc); L4 = mm(L2, L2, rc); L8 = mm(L4, L4, rc)
        D = mm(mm(A, If + L4, rc), If + L8, rc)
        Ct = D * bb[..., None, :].float()
        Cs = -mm(mm(D[:, :, 1:], E.float(), rs), Ct[:, :, :-1], rs)
        bfr = lambda x: x.bfloat16().float()
        out.append(f"{name}: diag {rel(Ct, Ct64):.1e}/{rel(bfr(Ct), Ct64):.1e} sub {rel(Cs, Cs64):.1e}/{rel(bfr(Cs), Cs64):.1e}")
    print("\n   ".join(out))
print("--- per chain product (1 = fp32), spread 0.1: products L2, A, L4, L8, B, D")
import itertools
for mask in [(1,1,0,0,0,0),(0,0,0,0,1,1),(1,1,1,1,0,0),(0,0,1,1,1,1),(1,1,0,0,1,1),(1,0,0,0,0,0),(0,1,0,0,0,0),(0,0,0,0,0,1),(0,0,0,0,1,0)]:
    r = [f32 if m else tf32 for m in mask]
    Lf = L.float(); If = I.float()
    L2 = mm(Lf, Lf, r[0]); A = mm(If - Lf, If + L2, r[1]); L4 = mm(L2, L2, r[2]); L8 = mm(L4, L4, r[3])
    D = mm(mm(A, If + L4, r[4]), If + L8, r[5])
    Ct = D * bb[..., None, :].float()
    Cs = -mm(mm(D[:, :, 1:], E.float(), tf32), Ct[:, :, :-1], tf32)
    print(mask, f"diag {rel(Ct, Ct64):.1e} sub {rel(Cs, Cs64):.1e}")
print("--- tf32 chain + one refinement step D' = D + D (I - (I+L) D)")
def x3(a, b):  # 3-pass tf32: a_hi b_hi + a_hi b_lo + a_lo b_hi
    ah, bh = tf32(a), tf32(b); al, bl = tf32(a.float() - ah), tf32(b.float() - bh)
    return (ah.double() @ bh.double() + ah.double() @ bl.double() + al.double() @ bh.double()).float()
for rr in ("x3", "f32", "tf32"):
    Lf = L.float(); If = I.float()
    L2 = mm(Lf, Lf, tf32); A = mm(If - Lf, If + L2, tf32); L4 = mm(L2, L2, tf32); L8 = mm(L4, L4, tf32)
    D = mm(mm(A, If + L4, tf32), If + L8, tf32)
    P = x3(If + Lf, D) if rr == "x3" else mm(If + Lf, D, f32 if rr == "f32" else tf32)
    R = If - P
    D = D + mm(D, R, tf32)
    Ct = D * bb[..., None, :].float()
    for sub in ("tf32", "x3"):
        Cs = -(mm(mm(D[:, :, 1:], E.float(), tf32), Ct[:, :, :-1], tf32) if sub == "tf32" else x3(x3(D[:, :, 1:], E.float()), Ct[:, :, :-1]))
        print(rr, sub, f"diag {rel(Ct, Ct64):.1e} sub {rel(Cs, Cs64):.1e} after bf16 {rel(Cs.bfloat16().float(), Cs64):.1e}")
