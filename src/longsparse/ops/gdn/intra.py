"""SparseGDN intra stage on the GPU: the block-adjacent local solve and the tail-16 score of every chunk.

One program per (chunk, head pair): the pair's value heads share the chunk's keys, so the Gram matrix ``K Kᵀ`` is
formed once. Per value head, with ``M = I + A_Δ`` (notes Eq. 5) split into its strictly lower diagonal-block part
``L`` (the four 16×16 blocks on the diagonal) and its sub-diagonal blocks ``E`` (the three blocks ``M_{i,i-1}``),
the kept blocks of ``C ≈ M⁻¹`` (Eqs. 7–8) are, as whole 64×64 tiles,

    D = (I + L)⁻¹ = (I − L)(I + L²)(I + L⁴)(I + L⁸)      (L¹⁶ = 0: every diagonal block is 16×16 nilpotent)
    C = D − D E D                                      (its diagonal blocks are C_ii, its sub-diagonal ones C_{i,i-1})

— six and two 64×64 products on the tensor cores (3-pass tf32, about fp32 accuracy) instead of many dependent
16×16 ones. Stored per (chunk, value head): the seven kept blocks of ``Ct = C diag(β)`` in :data:`BLOCK_ORDER` (so that
``U = Ct V`` and ``W = Ct diag(e^G) K``), the chunk decay ``γ = G_last`` and the tail score ``s = ‖U[48:64]‖_F``
(Eq. 9). U itself is not stored: the main pass (fused.py) recomputes it where it walks the chunk.
"""

from __future__ import annotations

import torch

from ..._optional import require
from .spec.intra import BLOCK_PAIRS

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

BLOCK_ORDER = BLOCK_PAIRS  # the seven kept 16×16 blocks (row block, column block), in the specification's order


@triton.jit
def _mm(a, b, IEEE: tl.constexpr):
    """Product with fp32 accumulation; operands in the input dtype (fp32 inputs: full-precision products)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _mm32(a, b, IEEE: tl.constexpr):
    """fp32 × fp32 product at about fp32 accuracy: the solve must not go through plain tf32."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b, input_precision="tf32x3")


@triton.jit
def _block_coords():
    """Row/column indices of a 64×64 tile and their 16-row block indices."""
    i = tl.arange(0, 64)[:, None]
    j = tl.arange(0, 64)[None, :]
    return i, j, i // 16, j // 16


@triton.jit
def _kept_offsets(i, j, bi, bj):
    """Offset of each kept element inside the 7 stored 16×16 blocks, and the kept mask (diagonal + sub-diagonal)."""
    kept = (bj == bi) | (bj == bi - 1)
    blk = tl.where(bj == bi, bi, bi + 3)
    return blk * 256 + (i % 16) * 16 + (j % 16), kept


@triton.jit
def sparse_gdn_fwd_kernel_intra(
    k,
    v,
    g,
    beta,
    ct,
    gamma,
    score,
    chunk_bos,
    chunk_len,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    IEEE: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    GS: tl.constexpr = HV // H
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    o64 = tl.arange(0, 64)
    rows = o64 < n
    offs_k = tl.arange(0, K)
    offs_v = tl.arange(0, V)
    kc = tl.load(k + (bos + o64)[:, None] * (H * K) + i_h * K + offs_k[None, :], mask=rows[:, None], other=0.0)
    gram = _mm(kc, tl.trans(kc), IEEE)  # [64, 64], shared by the pair's value heads
    i, j, bi, bj = _block_coords()
    eye = (i == j).to(tl.float32)
    in_diag = (bi == bj) & (i > j)
    in_sub = bi == bj + 1
    offs, kept = _kept_offsets(i, j, bi, bj)
    for jj in tl.static_range(GS):
        i_hv = i_h * GS + jj
        G = tl.cumsum(tl.load(g + (bos + o64) * HV + i_hv, mask=rows, other=0.0).to(tl.float32), 0)
        b = tl.load(beta + (bos + o64) * HV + i_hv, mask=rows, other=0.0).to(tl.float32)
        causal = in_diag | in_sub
        m = b[:, None] * gram * tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
        L = tl.where(in_diag, m, 0.0)
        E = tl.where(in_sub, m, 0.0)
        L2 = _mm32(L, L, IEEE)
        L4 = _mm32(L2, L2, IEEE)
        L8 = _mm32(L4, L4, IEEE)
        D = _mm32(_mm32(_mm32(eye - L, eye + L2, IEEE), eye + L4, IEEE), eye + L8, IEEE)
        C = D - _mm32(_mm32(D, E, IEEE), D, IEEE)
        Ct = C * b[None, :]
        p_ct = ct + (i_c.to(tl.int64) * HV + i_hv) * (7 * 256)
        tl.store(p_ct + offs, Ct.to(ct.dtype.element_ty), mask=kept)
        tl.store(gamma + i_c.to(tl.int64) * HV + i_hv, tl.sum(tl.where(o64 == 63, G, 0.0), 0))
        # Tail score from the coefficients as stored (the main pass computes U from the same numbers).
        vc = tl.load(v + (bos + o64)[:, None] * (HV * V) + i_hv * V + offs_v[None, :], mask=rows[:, None], other=0.0)
        ct_used = tl.where(kept, Ct, 0.0).to(ct.dtype.element_ty).to(vc.dtype)
        u = _mm(ct_used, vc, IEEE)
        tail = tl.where((o64 >= 48)[:, None], u * u, 0.0)
        tl.store(score + i_c.to(tl.int64) * HV + i_hv, tl.sqrt(tl.sum(tl.sum(tail, 1), 0)))


def intra_forward(k, v, g, beta, chunk_bos, chunk_len, *, coef_dtype=None, num_warps=4):
    """Run the intra stage on packed inputs.

    Args:
        k: ``[T, H, K]``, v: ``[T, HV, V]``, g (natural-log decay) and beta: ``[T, HV]`` — sequences laid end to end.
        chunk_bos, chunk_len: ``[NC]`` int32 first token and valid tokens of every chunk.
        coef_dtype: dtype of the stored coefficients (default: k's dtype, float32 for float32 inputs).

    Returns:
        ``(ct [NC, HV, 7, 16, 16], gamma [NC, HV] float32, score [NC, HV] float32)``.
    """
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    NC = chunk_bos.numel()
    dev = k.device
    ct = torch.empty(NC, HV, 7, 16, 16, dtype=coef_dtype or k.dtype, device=dev)
    gamma = torch.empty(NC, HV, dtype=torch.float32, device=dev)
    score = torch.empty(NC, HV, dtype=torch.float32, device=dev)
    if NC:
        sparse_gdn_fwd_kernel_intra[(NC, H)](
            k,
            v,
            g,
            beta,
            ct,
            gamma,
            score,
            chunk_bos,
            chunk_len,
            H=H,
            HV=HV,
            K=K,
            V=V,
            IEEE=k.dtype == torch.float32,
            num_warps=num_warps,
        )
    return ct, gamma, score
