"""SparseGDN event-sparse recurrence on the GPU (the csr main pass, first kernel): only the selected chunks.

One program per (segment, value head, V tile); a segment is a run of chunks of one sequence, as in ``fused.py``, and
its program visits the events of its (sequence, pair) whose chunks lie in the segment, read from the device-built CSR
(``csr.py``). With the state tile ``S [K, BV]`` in fp32 registers and ``P`` the exclusive prefix of the chunk decays
(launch.decay_prefix, float64), per event at chunk c (``Ct`` = the kept blocks of ``C diag(β)``, intra.py):

    S   ← e^{P_c − P_end} S          the skipped chunks since the previous event only decay (Eq. 20)
    W   = Ct diag(e^G) K_c,   U' = Ct V_c − W S          (stored, input dtype: the output pass reads it)
    S   ← e^{γ_c} S + K_cᵀ (U' ⊙ e^{γ_c − G_c})          (stored as the state after the event)
    P_end = P_c + γ_c

The body has no branches (Triton 3.6 miscompiles tensor-core products inside branches of a loop body on sm_90; see
``fused.py``). A segment starts from the initial state (or zeros) when it is a sequence's first, else from the entry
state that ``fused.sparse_gdn_fwd_kernel_entry`` warmed up; the program owning a sequence's last chunk stores the
final state ``e^{P_C − P_end} S``. Per event the work is the H stage of SparseGDN (Zhuang et al., arXiv:2610.41420)
(equation numbers above are the paper's): W, W S, Ct V and Kᵀ U' — no output, no skipped chunk touched.
"""

from __future__ import annotations

from ...._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

from .fused import _chunk_tiles, _segment_program, _segment_start_state, _state_tile  # noqa: E402
from .intra import _mm  # noqa: E402


@triton.jit
def sparse_gdn_fwd_kernel_recur(
    k,
    v,
    g,
    ct,
    prefix,
    decay_total,
    h0,
    entry,
    event_index,
    event_chunk,
    u_new,
    states,
    ht,
    seg_seq,
    seg_c0,
    seg_c1,
    seq_chunk0,
    seq_nchunks,
    chunk_bos,
    chunk_len,
    P: tl.constexpr,
    CMAX: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_H0: tl.constexpr,
    HAS_ENTRY: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Writes ``u_new [capacity, HV/H, 64, V]`` (U' of each event, input dtype), ``states [capacity, HV/H, K, V]``
    (state after each event) for the pair's value heads in order, and ``ht [N, HV, K, V]`` fp32."""
    i_s, i_hv, i_v = _segment_program(HV, V // BV)
    GS: tl.constexpr = HV // H
    i_h = i_hv // GS
    i_j = i_hv % GS
    n_seq = tl.load(seg_seq + i_s)
    c0 = tl.load(seg_c0 + i_s)
    c1 = tl.load(seg_c1 + i_s)
    base = tl.load(seq_chunk0 + n_seq)
    n_chunks = tl.load(seq_nchunks + n_seq)
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    o64 = tl.arange(0, 64)
    idx_row = event_index + (n_seq * P + i_h).to(tl.int64) * (CMAX + 1)
    e_a = tl.load(idx_row + c0)
    e_b = tl.load(idx_row + c1)

    S = _segment_start_state(entry, h0, i_s, n_seq, i_hv, offs_k, offs_v, HV, K, V, BV, HAS_ENTRY, HAS_H0)
    # P at the segment start: S is the state entering chunk c0 (P = 0 at the sequence's first chunk).
    p_end = tl.load(prefix + (base + c0).to(tl.int64) * HV + i_hv)

    for e in range(e_a, e_b):
        c = tl.load(event_chunk + e)
        cg = base + c
        p_c = tl.load(prefix + cg.to(tl.int64) * HV + i_hv)
        S = S * tl.exp((p_c - p_end).to(tl.float32))
        _, _, G, g_last, kc, vc, coef = _chunk_tiles(
            k, v, g, ct, chunk_bos, chunk_len, cg, i_h, i_hv, offs_k, offs_v, H, HV, K, V, False
        )
        kd = kc.dtype
        w = _mm((coef * tl.exp(G)[None, :]).to(kd), kc, IEEE)
        u = _mm(coef.to(kd), vc.to(kd), IEEE) - _mm(w.to(kd), S.to(kd), IEEE)
        slot = (e * GS + i_j).to(tl.int64)
        tl.store(u_new + (slot * 64 + o64[:, None]) * V + offs_v[None, :], u.to(u_new.dtype.element_ty))
        S = S * tl.exp(g_last) + _mm(tl.trans(kc), (u * tl.exp(g_last - G)[:, None]).to(kd), IEEE)
        tl.store(_state_tile(states, slot, offs_k, offs_v, K, V), S.to(states.dtype.element_ty))
        p_end = p_c + g_last.to(tl.float64)

    if c1 == n_chunks:
        tail = tl.exp((tl.load(decay_total + n_seq * HV + i_hv) - p_end).to(tl.float32))
        tl.store(_state_tile(ht, n_seq * HV + i_hv, offs_k, offs_v, K, V), S * tail)
