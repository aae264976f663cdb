"""Precision of intra's block inverse D = (I + L)^-1 = (I − L)(I + L²)(I + L⁴)(I + L⁸) when the tensor-core
products take tf32 operands (as built) or bf16 ones (which would let one product's accumulator feed the next
product's operand in registers, m16n8k16): each product emulated in torch on the CPU as an exact product of rounded
operands with an fp32 result, against the float64 inverse, for Ct = D diag(β) before and after its bf16 storage.
Inputs: the benchmark's (random unit keys, ``bench.gdn.make_inputs``) and keys correlated around a common direction,
k = normalize(base + s·noise), as trained models' keys often are. ``python bf16_inverse_precision.py`` (~1 min)."""
import torch
from longsparse.bench.gdn import make_inputs
torch.manual_seed(0)
def tf32(x):
    """Round fp32 to tf32's 10 mantissa bits (nearest, ties away from zero)."""
    i = x.float().contiguous().view(torch.int32)
    i = (i + 0x1000) & ~0x1FFF  # round to nearest (ties away) at 10 mantissa bits
    return i.view(torch.float32)
def bf16(x): return x.float().to(torch.bfloat16).float()
def mm(a, b, rnd): return (rnd(a).double() @ rnd(b).double()).float()  # exact products of rounded operands, fp32 out
T = 8192
q, k, v, g, beta, *_ = make_inputs(1, T, 4.0, device="cpu")
k = k[0, :, 0].float(); g = g[0, :, 0].double(); b = beta[0, :, 0].double()
NC = T // 64
kk = k.view(NC, 4, 16, 128).double()
G = g.view(NC, 64).cumsum(1).view(NC, 4, 16)
bb = b.view(NC, 4, 16)
gram = kk @ kk.transpose(-1, -2)
dec = torch.exp(G[..., :, None] - G[..., None, :])
strict = torch.tril(torch.ones(16, 16, dtype=torch.bool), -1)
L = torch.where(strict, bb[..., :, None] * gram * dec, 0.0)
I = torch.eye(16, dtype=torch.float64)
D64 = torch.linalg.inv(I + L)
def chain(r1, r2):
    """L², (I−L)(I+L²) with rounding r1; L⁴, L⁸ and the last two products with r2."""
    Lf = L.float(); If = I.float()
    L2 = mm(Lf, Lf, r1); A = mm(If - Lf, If + L2, r1)
    L4 = mm(L2, L2, r2); L8 = mm(L4, L4, r2)
    B = mm(A, If + L4, r2); return mm(B, If + L8, r2)
ref = (D64 * bb[..., None, :]).float()
def rel(x): return ((x.double() - ref.double()).norm() / ref.double().norm()).item()
print("bf16 storage of Ct itself:", rel(bf16(ref)))
for name, r1, r2 in (("tf32 all (now)", tf32, tf32), ("tf32 L², bf16 rest", tf32, bf16), ("bf16 all", bf16, bf16)):
    D = chain(r1, r2); Ct = D * bb[..., None, :].float()
    print(f"{name:22s} Ct error {rel(Ct):.2e}   after bf16 storage {rel(bf16(Ct)):.2e}")
print("|L| max", L.abs().max().item(), " |L^4| max", torch.linalg.matrix_power(L, 4).abs().max().item())
print("--- correlated keys: k = normalize(base + s * noise)")
for s in (1.0, 0.3, 0.1):
    base = torch.randn(NC, 1, 1, 128, dtype=torch.float64)
    kk2 = torch.nn.functional.normalize(base + s * torch.randn(NC, 4, 16, 128, dtype=torch.float64), dim=-1)
    kk2 = kk2.to(torch.bfloat16).double()
    gram2 = kk2 @ kk2.transpose(-1, -2)
    L = torch.where(strict, bb[..., :, None] * gram2 * dec, 0.0)
    D64 = torch.linalg.inv(I + L)
    ref = (D64 * bb[..., None, :]).float()
    out = [f"s={s}: |L| max {L.abs().max().item():.2f}, |Ct| max {ref.abs().max().item():.1f}; storage {rel(bf16(ref)):.2e}"]
    for name, r1, r2 in (("tf32", tf32, tf32), ("tf32 L2 + bf16", tf32, bf16), ("bf16", bf16, bf16)):
        D = chain(r1, r2); Ct = D * bb[..., None, :].float()
        out.append(f"{name} {rel(Ct):.2e}/{rel(bf16(Ct)):.2e}")
    print("  ".join(out))
