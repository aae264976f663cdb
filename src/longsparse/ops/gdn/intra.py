"""SparseGDN intra stage on the GPU: block-adjacent solve, U, tail-16 score and the selector's per-chunk statistics.

One program per (chunk, value head). The 64-token chunk is handled as four 16-token row blocks; only the diagonal
blocks ``M_ii`` and the sub-diagonal blocks ``M_{i,i-1}`` of the local delta system are formed (7 of 16 blocks), and
the kept blocks of ``C ≈ M⁻¹`` follow from

    C_ii = M_ii⁻¹ = (I − L)(I + L²)(I + L⁴)(I + L⁸)       (L the strictly lower part of M_ii; L¹⁶ = 0)
    C_{i,i-1} = −C_ii M_{i,i-1} C_{i-1,i-1}

— four small matrix products per block instead of a 16-step substitution, so the whole solve runs on tensor cores.
Outputs (per chunk and value head): ``U_i = C_ii β_i V_i + C_{i,i-1} β_{i-1} V_{i-1}`` in the layout of ``v``; the
seven weighted blocks ``Cbar_ij = C_ij diag(β_j e^{G_j})`` that build ``W`` later for selected events only; the
chunk-local cumulative decay ``G``; the chunk decay ``γ = G_last``; the tail score ``s = ‖U[48:64]‖_F``; and the
sampled output-gate energy used for head visibility.
"""

from __future__ import annotations

import torch

from ..._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

BLOCK_ORDER = ((0, 0), (1, 1), (2, 2), (3, 3), (1, 0), (2, 1), (3, 2))
GATE_SAMPLE_POSITIONS = (8, 24, 40, 56)


@triton.jit
def _rows(ptr, row0, n_valid, stride_t, offs_d, D: tl.constexpr):
    """Load rows ``row0 .. row0+15`` (masked past ``n_valid``) of a row-major ``[*, stride_t]`` view: ``[16, D]``."""
    o_t = row0 + tl.arange(0, 16)
    mask = (o_t < n_valid)[:, None] & (offs_d < D)[None, :]
    return tl.load(ptr + o_t.to(tl.int64)[:, None] * stride_t + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _vec(ptr, row0, n_valid, stride_t):
    """Load a 16-long per-token vector (masked past ``n_valid``) as float32."""
    o_t = row0 + tl.arange(0, 16)
    return tl.load(ptr + o_t.to(tl.int64) * stride_t, mask=o_t < n_valid, other=0.0).to(tl.float32)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
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
    tl.store(ptr + o[:, None] * 16 + o[None, :], X)


@triton.jit
def sparse_gdn_fwd_kernel_intra(
    k,
    v,
    g,
    beta,
    z,
    gate_w,
    u,
    cbar,
    gcum,
    gamma,
    score,
    eta,
    chunk_bos,
    chunk_len,
    chunk_pos,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_GATE: tl.constexpr,
    IEEE: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_h = i_hv // (HV // H)
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)

    offs_k = tl.arange(0, K)
    k_base = k + bos * (H * K) + i_h * K
    k0 = _rows(k_base, 0, n, H * K, offs_k, K)
    k1 = _rows(k_base, 16, n, H * K, offs_k, K)
    k2 = _rows(k_base, 32, n, H * K, offs_k, K)
    k3 = _rows(k_base, 48, n, H * K, offs_k, K)

    gb = g + bos * HV + i_hv
    bb = beta + bos * HV + i_hv
    g0 = tl.cumsum(_vec(gb, 0, n, HV), 0)
    g1 = tl.cumsum(_vec(gb, 16, n, HV), 0) + tl.sum(tl.where(tl.arange(0, 16) == 15, g0, 0.0), 0)
    g2 = tl.cumsum(_vec(gb, 32, n, HV), 0) + tl.sum(tl.where(tl.arange(0, 16) == 15, g1, 0.0), 0)
    g3 = tl.cumsum(_vec(gb, 48, n, HV), 0) + tl.sum(tl.where(tl.arange(0, 16) == 15, g2, 0.0), 0)
    b0 = _vec(bb, 0, n, HV)
    b1 = _vec(bb, 16, n, HV)
    b2 = _vec(bb, 32, n, HV)
    b3 = _vec(bb, 48, n, HV)

    # Diagonal and sub-diagonal Gram blocks: 7 of the 16 blocks of K Kᵀ.
    c00 = _unit_lower_inverse(_diag_system(_dot(k0, tl.trans(k0), IEEE), b0, g0))
    c11 = _unit_lower_inverse(_diag_system(_dot(k1, tl.trans(k1), IEEE), b1, g1))
    c22 = _unit_lower_inverse(_diag_system(_dot(k2, tl.trans(k2), IEEE), b2, g2))
    c33 = _unit_lower_inverse(_diag_system(_dot(k3, tl.trans(k3), IEEE), b3, g3))
    c10 = -_dot32(_dot32(c11, _off_system(_dot(k1, tl.trans(k0), IEEE), b1, g1, g0)), c00)
    c21 = -_dot32(_dot32(c22, _off_system(_dot(k2, tl.trans(k1), IEEE), b2, g2, g1)), c11)
    c32 = -_dot32(_dot32(c33, _off_system(_dot(k3, tl.trans(k2), IEEE), b3, g3, g2)), c22)

    # Cbar_ij = C_ij diag(β_j e^{G_j}): the coefficients of W = Cbar K for the events selected later.
    w0 = b0 * tl.exp(g0)
    w1 = b1 * tl.exp(g1)
    w2 = b2 * tl.exp(g2)
    cb = cbar + (i_c.to(tl.int64) * HV + i_hv) * (7 * 256)
    _store_block(cb + 0 * 256, c00 * w0[None, :])
    _store_block(cb + 1 * 256, c11 * w1[None, :])
    _store_block(cb + 2 * 256, c22 * w2[None, :])
    _store_block(cb + 3 * 256, c33 * (b3 * tl.exp(g3))[None, :])
    _store_block(cb + 4 * 256, c10 * w0[None, :])
    _store_block(cb + 5 * 256, c21 * w1[None, :])
    _store_block(cb + 6 * 256, c32 * w2[None, :])

    # Per-token cumulative decay and the chunk decay γ (padding has g = 0, so G_last is the valid tokens' sum).
    o16 = tl.arange(0, 16)
    gc = gcum + bos * HV + i_hv
    tl.store(gc + o16.to(tl.int64) * HV, g0, mask=o16 < n)
    tl.store(gc + (16 + o16).to(tl.int64) * HV, g1, mask=16 + o16 < n)
    tl.store(gc + (32 + o16).to(tl.int64) * HV, g2, mask=32 + o16 < n)
    tl.store(gc + (48 + o16).to(tl.int64) * HV, g3, mask=48 + o16 < n)
    tl.store(gamma + i_c.to(tl.int64) * HV + i_hv, tl.sum(tl.where(o16 == 15, g3, 0.0), 0))

    # U = C (β V), block by block; V in tiles of BV columns. The tail score accumulates over the tiles.
    cd = k.dtype.element_ty
    a00 = c00.to(cd)
    a11 = c11.to(cd)
    a22 = c22.to(cd)
    a33 = c33.to(cd)
    a10 = c10.to(cd)
    a21 = c21.to(cd)
    a32 = c32.to(cd)
    tail = tl.zeros([16], dtype=tl.float32)
    v_base = v + bos * (HV * V) + i_hv * V
    u_base = u + bos * (HV * V) + i_hv * V
    for i_v in range(0, V, BV):
        offs_v = i_v + tl.arange(0, BV)
        bv0 = (_rows(v_base, 0, n, HV * V, offs_v, V) * b0[:, None]).to(cd)
        bv1 = (_rows(v_base, 16, n, HV * V, offs_v, V) * b1[:, None]).to(cd)
        bv2 = (_rows(v_base, 32, n, HV * V, offs_v, V) * b2[:, None]).to(cd)
        bv3 = (_rows(v_base, 48, n, HV * V, offs_v, V) * b3[:, None]).to(cd)
        u0 = _dot(a00, bv0, IEEE)
        u1 = _dot(a11, bv1, IEEE) + _dot(a10, bv0, IEEE)
        u2 = _dot(a22, bv2, IEEE) + _dot(a21, bv1, IEEE)
        u3 = _dot(a33, bv3, IEEE) + _dot(a32, bv2, IEEE)
        tail += tl.sum(u3 * u3, 1)
        m_v = (offs_v < V)[None, :]
        o_u = offs_v[None, :]
        tl.store(u_base + o16.to(tl.int64)[:, None] * (HV * V) + o_u, u0.to(u.dtype.element_ty), mask=(o16 < n)[:, None] & m_v)
        tl.store(u_base + (16 + o16).to(tl.int64)[:, None] * (HV * V) + o_u, u1.to(u.dtype.element_ty),
                 mask=(16 + o16 < n)[:, None] & m_v)
        tl.store(u_base + (32 + o16).to(tl.int64)[:, None] * (HV * V) + o_u, u2.to(u.dtype.element_ty),
                 mask=(32 + o16 < n)[:, None] & m_v)
        tl.store(u_base + (48 + o16).to(tl.int64)[:, None] * (HV * V) + o_u, u3.to(u.dtype.element_ty),
                 mask=(48 + o16 < n)[:, None] & m_v)
    tl.store(score + i_c.to(tl.int64) * HV + i_hv, tl.sqrt(tl.sum(tail, 0)))

    # Visibility: the gate energy (w_v · silu(z))² at positions 8, 24, 40, 56, coordinate 73·(4c + a) mod V.
    if HAS_GATE:
        o4 = tl.arange(0, 4)
        pos = 8 + 16 * o4
        c_local = tl.load(chunk_pos + i_c)
        coord = (73 * (4 * c_local + o4)) % V
        ok = pos < n
        zz = tl.load(z + (bos + pos).to(tl.int64) * (HV * V) + i_hv * V + coord, mask=ok, other=0.0).to(tl.float32)
        ww = tl.load(gate_w + coord, mask=ok, other=0.0).to(tl.float32)
        e = ww * zz * tl.sigmoid(zz)
        tl.store(eta + i_c.to(tl.int64) * HV + i_hv, tl.sum(tl.where(ok, e * e, 0.0), 0))


def intra_forward(k, v, g, beta, table, gate=None, gate_norm_weight=None, u_dtype=None, BV=None):
    """Run the intra stage on packed inputs.

    Args:
        k: ``[T, H, K]``, v: ``[T, HV, V]``, g (natural-log decay) and beta: ``[T, HV]`` — sequences laid end to end
            as described by ``table`` (a :class:`~longsparse.ops.gdn.chunks.ChunkTable`).
        gate: pre-activation output gate ``z [T, HV, V]`` and gate_norm_weight ``[V]`` for the visibility statistic.

    Returns:
        dict with ``u [T, HV, V]`` (in ``u_dtype``, default v's dtype), ``cbar [NC, HV, 7, 16, 16]`` float32 in
        :data:`BLOCK_ORDER`, ``gcum [T, HV]`` float32 chunk-local cumulative decay, ``gamma [NC, HV]`` chunk decay,
        ``score [NC, HV]`` tail-16 norm of U, and ``eta [NC, HV]`` the summed sampled gate energy (zeros without a
        gate).
    """
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    NC = table.num_chunks
    dev = k.device
    u = torch.empty(T, HV, V, dtype=u_dtype or v.dtype, device=dev)
    out = dict(
        u=u,
        cbar=torch.empty(NC, HV, 7, 16, 16, dtype=torch.float32, device=dev),
        gcum=torch.empty(T, HV, dtype=torch.float32, device=dev),
        gamma=torch.empty(NC, HV, dtype=torch.float32, device=dev),
        score=torch.empty(NC, HV, dtype=torch.float32, device=dev),
        eta=torch.zeros(NC, HV, dtype=torch.float32, device=dev),
    )
    if NC == 0:
        return out
    has_gate = gate is not None
    BV = BV or min(V, 64)
    sparse_gdn_fwd_kernel_intra[(NC, HV)](
        k, v, g, beta,
        gate if has_gate else v, gate_norm_weight if has_gate else v,
        u, out["cbar"], out["gcum"], out["gamma"], out["score"], out["eta"],
        table.bos, table.length, table.pos,
        H=H, HV=HV, K=K, V=V, BV=BV, HAS_GATE=has_gate, IEEE=k.dtype == torch.float32,
    )
    return out
