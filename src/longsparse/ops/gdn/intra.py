"""SparseGDN intra stage on the GPU: the block-adjacent local solve and the tail-16 score of every chunk.

One program per (chunk, value head). The chunk is handled as four 16-token row blocks; only the diagonal blocks
``M_ii`` and the sub-diagonal blocks ``M_{i,i-1}`` of the local delta system are formed (7 of 16), and the kept
blocks of ``C ≈ M⁻¹`` follow from

    C_ii = M_ii⁻¹ = (I − L)(I + L²)(I + L⁴)(I + L⁸)       (L the strictly lower part of M_ii; L¹⁶ = 0)
    C_{i,i-1} = −C_ii M_{i,i-1} C_{i-1,i-1}

— a few 16×16 products per block instead of a 16-step substitution (the products run in full fp32).

Stored per (chunk, value head): the seven blocks of ``Ct = C diag(β)`` (so that ``U = Ct V`` and
``W = Ct diag(e^G) K``; notes Eqs. 6–8) in :data:`BLOCK_ORDER`, the chunk decay ``γ = G_last`` and the tail score
``s = ‖U[48:64]‖_F`` (Eq. 9) — ``U_3 = Ct_33 V_3 + Ct_32 V_2`` over every V column. U itself is not stored: the main
pass (fused.py) recomputes it from ``Ct`` where it walks the chunk.
"""

from __future__ import annotations

import torch

from ..._optional import require
from .spec.intra import BLOCK_PAIRS

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

BLOCK_ORDER = BLOCK_PAIRS  # the seven kept 16×16 blocks (row block, column block), in the specification's order


@triton.jit
def _rows(ptr, row0, n_valid, stride_t, offs_d, D: tl.constexpr):
    """Rows ``row0 .. row0+15`` (masked past ``n_valid``) of a row-major ``[*, stride_t]`` view: ``[16, D]``."""
    o_t = row0 + tl.arange(0, 16)
    mask = (o_t < n_valid)[:, None] & (offs_d < D)[None, :]
    return tl.load(ptr + o_t.to(tl.int64)[:, None] * stride_t + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _vec(ptr, row0, n_valid, stride_t):
    """A 16-long per-token vector (masked past ``n_valid``) as float32."""
    o_t = row0 + tl.arange(0, 16)
    return tl.load(ptr + o_t.to(tl.int64) * stride_t, mask=o_t < n_valid, other=0.0).to(tl.float32)


@triton.jit
def _mm(a, b, IEEE: tl.constexpr):
    """Product with fp32 accumulation; operands in the input dtype (fp32 inputs: full-precision products)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _dot32(a, b):
    """fp32 product in full precision (the small solve must not go through tf32)."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _unit_lower_inverse(L):
    """``(I + L)⁻¹`` for a strictly lower 16×16 ``L`` (fp32), by the nilpotent product formula."""
    o = tl.arange(0, 16)
    eye = (o[:, None] == o[None, :]).to(tl.float32)
    L2 = _dot32(L, L)
    L4 = _dot32(L2, L2)
    L8 = _dot32(L4, L4)
    X = _dot32(eye - L, eye + L2)
    X = _dot32(X, eye + L4)
    return _dot32(X, eye + L8)


@triton.jit
def _diag_system(kk, b_i, G_i):
    """Strictly lower ``L = β_a ⟨k_a, k_b⟩ e^{G_a − G_b}`` (a > b) of one diagonal block, fp32 ``[16, 16]``."""
    o = tl.arange(0, 16)
    lower = o[:, None] > o[None, :]
    decay = tl.exp(tl.where(lower, G_i[:, None] - G_i[None, :], float("-inf")))
    return b_i[:, None] * kk * decay


@triton.jit
def _off_system(kk, b_i, G_i, G_j):
    """``M_{i,j} = β_a ⟨k_a, k_b⟩ e^{G_a − G_b}`` for a block row after the block column (every entry causal)."""
    return b_i[:, None] * kk * tl.exp(G_i[:, None] - G_j[None, :])


@triton.jit
def _store_block(ptr, X):
    o = tl.arange(0, 16)
    tl.store(ptr + o[:, None] * 16 + o[None, :], X.to(ptr.dtype.element_ty))


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
    BV: tl.constexpr,
    IEEE: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    o16 = tl.arange(0, 16)
    offs_k = tl.arange(0, K)
    k_base = k + bos * (H * K) + i_h * K

    gb = g + bos * HV + i_hv
    bb = beta + bos * HV + i_hv
    g0 = tl.cumsum(_vec(gb, 0, n, HV), 0)
    g1 = tl.cumsum(_vec(gb, 16, n, HV), 0) + tl.sum(tl.where(o16 == 15, g0, 0.0), 0)
    g2 = tl.cumsum(_vec(gb, 32, n, HV), 0) + tl.sum(tl.where(o16 == 15, g1, 0.0), 0)
    g3 = tl.cumsum(_vec(gb, 48, n, HV), 0) + tl.sum(tl.where(o16 == 15, g2, 0.0), 0)
    b0 = _vec(bb, 0, n, HV)
    b1 = _vec(bb, 16, n, HV)
    b2 = _vec(bb, 32, n, HV)
    b3 = _vec(bb, 48, n, HV)

    # Seven Gram blocks, loading each key block when it is first needed so that few stay live.
    k0 = _rows(k_base, 0, n, H * K, offs_k, K)
    k1 = _rows(k_base, 16, n, H * K, offs_k, K)
    c00 = _unit_lower_inverse(_diag_system(_mm(k0, tl.trans(k0), IEEE), b0, g0))
    c11 = _unit_lower_inverse(_diag_system(_mm(k1, tl.trans(k1), IEEE), b1, g1))
    c10 = -_dot32(_dot32(c11, _off_system(_mm(k1, tl.trans(k0), IEEE), b1, g1, g0)), c00)
    k2 = _rows(k_base, 32, n, H * K, offs_k, K)
    c22 = _unit_lower_inverse(_diag_system(_mm(k2, tl.trans(k2), IEEE), b2, g2))
    c21 = -_dot32(_dot32(c22, _off_system(_mm(k2, tl.trans(k1), IEEE), b2, g2, g1)), c11)
    k3 = _rows(k_base, 48, n, H * K, offs_k, K)
    c33 = _unit_lower_inverse(_diag_system(_mm(k3, tl.trans(k3), IEEE), b3, g3))
    c32 = -_dot32(_dot32(c33, _off_system(_mm(k3, tl.trans(k2), IEEE), b3, g3, g2)), c22)

    # Ct = C diag(β): the coefficients of U = Ct V and W = Ct diag(e^G) K.
    t00 = c00 * b0[None, :]
    t11 = c11 * b1[None, :]
    t22 = c22 * b2[None, :]
    t33 = c33 * b3[None, :]
    t10 = c10 * b0[None, :]
    t21 = c21 * b1[None, :]
    t32 = c32 * b2[None, :]
    cb = ct + (i_c.to(tl.int64) * HV + i_hv) * (7 * 256)
    _store_block(cb + 0 * 256, t00)
    _store_block(cb + 1 * 256, t11)
    _store_block(cb + 2 * 256, t22)
    _store_block(cb + 3 * 256, t33)
    _store_block(cb + 4 * 256, t10)
    _store_block(cb + 5 * 256, t21)
    _store_block(cb + 6 * 256, t32)
    tl.store(gamma + i_c.to(tl.int64) * HV + i_hv, tl.sum(tl.where(o16 == 15, g3, 0.0), 0))

    # Tail score: ‖U_3‖ over all V columns, U_3 = Ct_33 V_3 + Ct_32 V_2 (the coefficients as stored).
    cd = ct.dtype.element_ty
    vd = v.dtype.element_ty
    a33 = t33.to(cd).to(vd)
    a32 = t32.to(cd).to(vd)
    tail = tl.zeros([16], dtype=tl.float32)
    v_base = v + bos * (HV * V) + i_hv * V
    for i_v in range(0, V, BV):
        offs_v = i_v + tl.arange(0, BV)
        u3 = _mm(a33, _rows(v_base, 48, n, HV * V, offs_v, V), IEEE)
        u3 += _mm(a32, _rows(v_base, 32, n, HV * V, offs_v, V), IEEE)
        tail += tl.sum(u3 * u3, 1)
    tl.store(score + i_c.to(tl.int64) * HV + i_hv, tl.sqrt(tl.sum(tail, 0)))


def intra_forward(k, v, g, beta, chunk_bos, chunk_len, *, coef_dtype=None, BV=None, num_warps=4):
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
        sparse_gdn_fwd_kernel_intra[(NC, HV)](
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
            BV=BV or min(V, 64),
            IEEE=k.dtype == torch.float32,
            num_warps=num_warps,
        )
    return ct, gamma, score
