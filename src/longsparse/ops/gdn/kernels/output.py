"""SparseGDN output on the GPU (the csr main pass, second kernel): every chunk, in parallel, from the stored states.

One program per (output group, value head, V tile); a group is the chunk pair (c, c + 1) = (2r, 2r + 1) of one
sequence (a lone last even chunk is a group of one). With the event CSR (``csr.py``) and the recurrence's stores
(``recur.py``: U' and the state after each event), for the value head's pair:

    S_c   = e^{P_c − P_{e+1}} S_after[e]    e = the pair's last event before c (none: e^{P_c} h0, or 0)
    U'_c  = the stored U' if c is selected, else Ct V_c
    O_c   = scale · [e^{G_c} ⊙ (Q_c S_c) + (Q_c K_cᵀ ⊙ e^{G_i − G_j} ⊙ causal) U'_c]
    X     = e^{γ_c} S_c + K_cᵀ (U'_c ⊙ e^{γ_c − G_c})
    O_c+1 = the same with S_{c+1} := X under grouped output, S_{c+1} := e^{γ_c} S_c + z_c (X − e^{γ_c} S_c) per chunk

X is the state after chunk c when c is selected and its would-be write when c is skipped (U' = U there), so the
grouped rule is exactly ``fused.py``'s (SparseGDN (Zhuang et al., arXiv:2610.41420) Eqs. 22–25:
``e^{G_c+1} Q_c+1 X = e^{G_c+1 + γ_c} Q_c+1 S_c + A_c+1,c U'_c``), and the odd chunk needs no stored state of its own.
Products are never inside a branch: the stored U' replaces Ct V through ``tl.where`` on the tile, the per-chunk rule
multiplies Kᵀ U' by z_c, and the group's one or two chunks are the trips of one runtime loop.
"""

from __future__ import annotations

from ...._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

from .fused import _causal_scores, _chunk_tiles, _state_tile  # noqa: E402
from .intra import _mm  # noqa: E402


@triton.jit
def sparse_gdn_fwd_kernel_output(
    q,
    k,
    v,
    g,
    ct,
    mask,
    prefix,
    gamma,
    h0,
    event_index,
    event_chunk,
    u_new,
    states,
    o,
    grp_seq,
    grp_pos,
    seq_chunk0,
    seq_nchunks,
    chunk_bos,
    chunk_len,
    scale,
    P: tl.constexpr,
    CMAX: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_H0: tl.constexpr,
    GROUPED: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Writes ``o [T, HV, V]`` for the chunks of group ``grp_seq, grp_pos`` (sequence, even local chunk)."""
    i_gr = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    GS: tl.constexpr = HV // H
    i_h = i_hv // GS
    i_j = i_hv % GS
    n_seq = tl.load(grp_seq + i_gr)
    c = tl.load(grp_pos + i_gr)
    base = tl.load(seq_chunk0 + n_seq)
    has_odd = c + 1 < tl.load(seq_nchunks + n_seq)
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    row = (n_seq * P + i_h).to(tl.int64)
    idx_row = event_index + row * (CMAX + 1)
    m_row = mask + row * CMAX

    # The state entering chunk c from the pair's last event before it (or from the initial state).
    ev_c = tl.load(idx_row + c)
    first = tl.load(idx_row)
    has_pred = ev_c > first
    pred = tl.maximum(ev_c - 1, 0)
    pred_chunk = base + tl.load(event_chunk + pred, mask=has_pred, other=0)
    p_pred = tl.load(prefix + pred_chunk.to(tl.int64) * HV + i_hv) + tl.load(gamma + pred_chunk * HV + i_hv).to(
        tl.float64
    )
    p_c = tl.load(prefix + (base + c).to(tl.int64) * HV + i_hv)
    p_after = tl.where(has_pred, p_pred, 0.0)
    full = (offs_k[:, None] >= 0) & (offs_v[None, :] >= 0)
    p_s = _state_tile(states, (pred * GS + i_j).to(tl.int64), offs_k, offs_v, K, V)
    S = tl.load(p_s, mask=full & has_pred, other=0.0).to(tl.float32)
    if HAS_H0:
        p_h = _state_tile(h0, n_seq * HV + i_hv, offs_k, offs_v, K, V)
        S = tl.where(has_pred, S, tl.load(p_h, mask=full & (ev_c == first), other=0.0).to(tl.float32))
    S = S * tl.exp((p_c - p_after).to(tl.float32))

    # Chunk c, then chunk c + 1 from the state after c: one loop body for both (branch-free, as in fused.py).
    o64 = tl.arange(0, 64)
    for t in range(0, 1 + has_odd.to(tl.int32)):
        cc = c + t
        cg = base + cc  # packed chunk index
        z = tl.load(m_row + cc) != 0  # selected: U' is the stored one, else Ct V
        bos, rows, G, g_last, kc, vc, coef = _chunk_tiles(
            k, v, g, ct, chunk_bos, chunk_len, cg, i_h, i_hv, offs_k, offs_v, H, HV, K, V, False
        )
        kd = kc.dtype
        qc = tl.load(q + (bos + o64)[:, None] * (H * K) + i_h * K + offs_k[None, :], mask=rows[:, None], other=0.0)
        slot = (tl.load(idx_row + cc) * GS + i_j).to(tl.int64)
        p_u = u_new + (slot * 64 + o64[:, None]) * V + offs_v[None, :]
        stored = tl.load(p_u, mask=rows[:, None] & z, other=0.0).to(tl.float32)
        u = tl.where(z, stored, _mm(coef.to(kd), vc.to(kd), IEEE))
        a = _causal_scores(_mm(qc, tl.trans(kc), IEEE), G)
        acc = tl.exp(G)[:, None] * _mm(qc, S.to(kd), IEEE) + _mm(a.to(kd), u.to(kd), IEEE)
        p_o = o + (bos + o64)[:, None] * (HV * V) + i_hv * V + offs_v[None, :]
        tl.store(p_o, (scale * acc).to(o.dtype.element_ty), mask=rows[:, None])
        decayed = S * tl.exp(g_last)  # the state after chunk cc (unused after the last chunk: one spare product)
        write = _mm(tl.trans(kc), (u * tl.exp(g_last - G)[:, None]).to(kc.dtype), IEEE)
        if GROUPED:
            S = decayed + write
        else:
            S = decayed + z.to(tl.float32) * write
