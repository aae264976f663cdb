"""SparseGDN mapped output on the GPU: every token's output from compact snapshots and two-chunk local terms.

One program per (output group, value head, V tile). A group is two consecutive chunks ``(c, c+1) = (2r, 2r+1)`` of a
sequence (a lone last chunk forms its own group); per-chunk output is the same kernel with one-chunk groups. Both
chunks read the group-entry state ``S_c``, recovered from the snapshot of the last selected chunk before the group by
the decay prefix (or from the initial state, or zero):

    O_c     = scale · [e^{G_c} ⊙ (Q_c S_c) + A_{c,c} U'_c]
    O_{c+1} = scale · [e^{G_{c+1}+γ_c} ⊙ (Q_{c+1} S_c) + A_{c+1,c} U'_c + A_{c+1,c+1} U'_{c+1}]

with ``A_{x,y}[i,j] = ⟨q_i, k_j⟩ e^{G_{x,i} − G_{y,j}}`` (causal within a chunk; ``γ_c`` added across the pair).
``U'`` lives in the output buffer and is overwritten by ``O`` (each program reads its tiles before writing them).
"""

from __future__ import annotations

from ..._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

from .recur import _mm  # noqa: E402


@triton.jit
def _tile(ptr, n_valid, stride_t, offs_d, D: tl.constexpr):
    """Rows 0..63 (masked past ``n_valid``) of a row-major view: ``[64, len(offs_d)]``."""
    o_t = tl.arange(0, 64)
    mask = (o_t < n_valid)[:, None] & (offs_d < D)[None, :]
    return tl.load(ptr + o_t.to(tl.int64)[:, None] * stride_t + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _tokvec(ptr, n_valid, stride_t):
    o_t = tl.arange(0, 64)
    return tl.load(ptr + o_t.to(tl.int64) * stride_t, mask=o_t < n_valid, other=0.0).to(tl.float32)


@triton.jit
def sparse_gdn_fwd_kernel_output(
    q,
    k,
    o,
    gcum,
    gamma,
    prefix,
    h0,
    snaps,
    group_chunk,
    group_size,
    group_seq,
    group_snap,
    group_pred,
    chunk_bos,
    chunk_len,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_H0: tl.constexpr,
    IEEE: tl.constexpr,
):
    i_g = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    GS: tl.constexpr = HV // H
    i_h = i_hv // GS
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    o64 = tl.arange(0, 64)
    kd = k.dtype.element_ty

    c0 = tl.load(group_chunk + i_g)
    size = tl.load(group_size + i_g)
    n_seq = tl.load(group_seq + i_g)
    p0 = tl.load(prefix + c0.to(tl.int64) * HV + i_hv)

    # The group-entry state: predecessor snapshot bridged by the decay prefix, else the decayed initial state.
    slot = tl.load(group_snap + i_g.to(tl.int64) * H + i_h)
    pc = tl.load(group_pred + i_g.to(tl.int64) * H + i_h)
    S = tl.zeros([K, BV], dtype=tl.float32)
    if slot >= 0:
        p_after = tl.load(prefix + pc.to(tl.int64) * HV + i_hv) + tl.load(gamma + pc.to(tl.int64) * HV + i_hv)
        p_s = snaps + ((slot.to(tl.int64) * GS + i_hv % GS) * K + offs_k[:, None]) * V + offs_v[None, :]
        S = tl.load(p_s).to(tl.float32) * tl.exp((p0 - p_after).to(tl.float32))
    elif HAS_H0:
        p_h = h0 + ((n_seq * HV + i_hv).to(tl.int64) * K + offs_k[:, None]) * V + offs_v[None, :]
        S = tl.load(p_h).to(tl.float32) * tl.exp(p0.to(tl.float32))
    Sd = S.to(kd)

    bos0 = tl.load(chunk_bos + c0).to(tl.int64)
    n0 = tl.load(chunk_len + c0)
    q0 = _tile(q + bos0 * (H * K) + i_h * K, n0, H * K, offs_k, K)
    k0 = _tile(k + bos0 * (H * K) + i_h * K, n0, H * K, offs_k, K)
    o_base0 = o + bos0 * (HV * V) + i_hv * V
    u0 = _tile(o_base0, n0, HV * V, offs_v, V)
    G0 = _tokvec(gcum + bos0 * HV + i_hv, n0, HV)
    causal = o64[:, None] >= o64[None, :]
    a00 = _mm(q0, tl.trans(k0), IEEE) * tl.exp(tl.where(causal, G0[:, None] - G0[None, :], float("-inf")))
    out0 = tl.exp(G0)[:, None] * _mm(q0, Sd, IEEE) + _mm(a00.to(kd), u0, IEEE)

    if size == 2:
        c1 = c0 + 1
        bos1 = tl.load(chunk_bos + c1).to(tl.int64)
        n1 = tl.load(chunk_len + c1)
        g0 = tl.load(gamma + c0.to(tl.int64) * HV + i_hv)
        q1 = _tile(q + bos1 * (H * K) + i_h * K, n1, H * K, offs_k, K)
        k1 = _tile(k + bos1 * (H * K) + i_h * K, n1, H * K, offs_k, K)
        o_base1 = o + bos1 * (HV * V) + i_hv * V
        u1 = _tile(o_base1, n1, HV * V, offs_v, V)
        G1 = _tokvec(gcum + bos1 * HV + i_hv, n1, HV)
        a10 = _mm(q1, tl.trans(k0), IEEE) * tl.exp(G1[:, None] + g0 - G0[None, :])
        a11 = _mm(q1, tl.trans(k1), IEEE) * tl.exp(tl.where(causal, G1[:, None] - G1[None, :], float("-inf")))
        out1 = tl.exp(G1 + g0)[:, None] * _mm(q1, Sd, IEEE) + _mm(a10.to(kd), u0, IEEE) + _mm(a11.to(kd), u1, IEEE)
        tl.store(o_base1 + o64.to(tl.int64)[:, None] * (HV * V) + offs_v[None, :], (scale * out1).to(o.dtype.element_ty),
                 mask=(o64 < n1)[:, None] & (offs_v < V)[None, :])
    tl.store(o_base0 + o64.to(tl.int64)[:, None] * (HV * V) + offs_v[None, :], (scale * out0).to(o.dtype.element_ty),
             mask=(o64 < n0)[:, None] & (offs_v < V)[None, :])
