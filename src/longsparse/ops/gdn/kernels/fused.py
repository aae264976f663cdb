"""SparseGDN main pass on the GPU: U, the event-sparse state update and the grouped output in one chunk walk.

One program per (segment, value head, V tile). A segment is a run of chunks of one sequence (an even number, so
output groups never straddle two segments); its program walks the chunks in order with the state tile
``S [K, BV]`` in fp32 registers and, per chunk ``c`` (``Ct`` = the kept blocks of ``C diag(β)`` from intra.py):

    U_c = Ct V_c
    O_c = scale · [e^{G_c} ⊙ (Q_c S_read) + (Q_c K_cᵀ ⊙ e^{G_i − G_j} ⊙ causal) U'_c]
    selected (z_c = 1):   W_c = Ct diag(e^G) K_c,  U'_c = U_c − W_c S_c,
                          S_{c+1} = e^{γ_c} S_c + K_cᵀ (U'_c ⊙ e^{γ_c − G_c})
    skipped:              U'_c = U_c,  S_{c+1} = e^{γ_c} S_c

``S_read`` is the state entering the chunk, except for the odd chunk of a group whose even chunk was skipped: there
it is ``e^{γ_{c-1}} S_{c-1} + K_{c-1}ᵀ (U_{c-1} ⊙ e^{γ_{c-1} − G_{c-1}})`` — the state the skipped chunk would have
written. That one term is the two-chunk grouped output of SparseGDN (Zhuang et al., arXiv:2610.41420), Eqs. 22–25:
``e^{G_c} Q_c`` times the would-be write equals ``e^{G_c + γ_{c-1}} Q_c S_{c-1} + A_{c,c-1} U_{c-1}``; when the even
chunk is selected, grouped and per-chunk output coincide. Nothing per chunk is materialised between stages: no U, no W,
no state snapshots.

Segments make the walk parallel. The state entering a segment comes from a separate kernel
(:func:`sparse_gdn_fwd_kernel_entry`, one program per segment, V tile and value head) that walks, without output,
from the latest chunk whose decay to the segment start is at least ``tau`` in log space (binary search in the decay
prefix), or from the start of the sequence (exact). With L2-normalised keys every exact chunk transition is a
contraction, so the truncation moves the entry state by at most ``e^{-tau}`` of its norm (``tau = 12``: 6e-6, far
below bf16 resolution); ``tau = inf`` always starts from the sequence start. Keeping the warm-up out of the main
kernel leaves the main loop the same for one segment or many (a second loop in the same kernel miscompiled under
Triton 3.6 on sm_90).
"""

from __future__ import annotations

from ...._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

from .intra import _block_coords, _causal_scores, _kept_offsets, _mm, _scores_tile, _store_chunk_scores  # noqa: E402


@triton.jit
def _coef_tile(ct_ptr):
    """The kept blocks of one chunk's ``Ct`` as a dense ``[64, 64]`` fp32 tile (zeros outside the 7 blocks)."""
    i, j, bi, bj = _block_coords()
    offs, kept = _kept_offsets(i, j, bi, bj)
    return tl.load(ct_ptr + offs, mask=kept, other=0.0).to(tl.float32)


@triton.jit
def _tile_coefficients(tiles, cg, i_hv, HV: tl.constexpr):
    """One chunk's dense ``Ct`` ``[64, 64]`` fp32 from rows 64-127 of its tile in ``tiles [NC, HV, 128, 64]`` (the
    Gluon walk's tiles, written by intra after the scores: ``intra._store_dense_coefficients``)."""
    o64 = tl.arange(0, 64)
    base = tiles + (cg.to(tl.int64) * HV + i_hv) * (128 * 64) + 64 * 64
    return tl.load(base + o64[:, None] * 64 + o64[None, :]).to(tl.float32)


@triton.jit
def _chunk_tiles(
    k, v, g, ct, chunk_bos, chunk_len, cg, i_h, i_hv, offs_k, offs_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CT_TILES: tl.constexpr,
):  # fmt: skip
    """What every main-pass kernel reads of packed chunk ``cg``: ``(bos, rows, G, γ, K_c, V_c, Ct)`` — the first
    token, the valid-row mask ``[64]``, the cumulative log-decays ``G [64]`` fp32 and their total ``γ``, the keys
    ``[64, K]`` and the V tile ``[64, BV]`` (input dtype, zero past the chunk's end) and ``Ct [64, 64]`` fp32, from
    the kept blocks ``ct [NC, HV, 7, 16, 16]`` or, with ``CT_TILES``, from the tiles ``ct [NC, HV, 128, 64]``
    (:func:`_tile_coefficients`)."""
    o64 = tl.arange(0, 64)
    bos = tl.load(chunk_bos + cg).to(tl.int64)
    rows = o64 < tl.load(chunk_len + cg)
    G = tl.cumsum(tl.load(g + (bos + o64) * HV + i_hv, mask=rows, other=0.0).to(tl.float32), 0)
    g_last = tl.sum(tl.where(o64 == 63, G, 0.0), 0)
    kc = tl.load(k + (bos + o64)[:, None] * (H * K) + i_h * K + offs_k[None, :], mask=rows[:, None], other=0.0)
    vc = tl.load(v + (bos + o64)[:, None] * (HV * V) + i_hv * V + offs_v[None, :], mask=rows[:, None], other=0.0)
    if CT_TILES:
        coef = _tile_coefficients(ct, cg, i_hv, HV)
    else:
        coef = _coef_tile(ct + (cg.to(tl.int64) * HV + i_hv) * (7 * 256))
    return bos, rows, G, g_last, kc, vc, coef


@triton.jit
def _segment_start_state(
    entry, h0, i_s, n_seq, i_hv, offs_k, offs_v,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    HAS_ENTRY: tl.constexpr, HAS_H0: tl.constexpr,
):  # fmt: skip
    """The fp32 state tile ``[K, BV]`` entering segment ``i_s``: its warmed-up entry state when the launch has them,
    else (a sequence's one segment) the initial state, else zeros."""
    if HAS_ENTRY:
        S = tl.load(_state_tile(entry, i_s * HV + i_hv, offs_k, offs_v, K, V))
    elif HAS_H0:
        S = tl.load(_state_tile(h0, n_seq * HV + i_hv, offs_k, offs_v, K, V)).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)
    return S


@triton.jit
def _chunk_step(
    q,
    k,
    v,
    g,
    ct,
    o,
    scores,
    m_row,
    c,
    cg,
    chunk_bos,
    chunk_len,
    S,
    S_read,
    scale,
    i_h,
    i_hv,
    offs_k,
    offs_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    WRITE_OUT: tl.constexpr,
    IEEE: tl.constexpr,
    KS_CORRECTION: tl.constexpr,
    HAS_SCORES: tl.constexpr,
    CT_TILES: tl.constexpr,
):
    """Walk chunk ``c`` (sequence-local; ``cg`` packed). Returns the state after the chunk and the would-be write
    ``e^{γ_c} S_c + K_cᵀ (U'_c ⊙ e^{γ_c − G_c})``, which is the state after the chunk when it is selected and the
    state the next (odd) chunk reads under grouped output when it is skipped.

    With ``WRITE_OUT`` the chunk's output is stored; its inter-chunk term reads ``S_read``. ``CT_TILES``: ``ct`` is
    the Gluon walk's tile buffer (:func:`_chunk_tiles`).

    The step has no branches: a skipped chunk's W correction is computed and multiplied by zero. Triton 3.6 on sm_90
    (the H200 image) miscompiles tensor-core products inside branches of this loop (accumulators read too early: wrong
    bf16 results; with other branch layouts, illegal addresses), so the event sparsity is not yet turned into skipped
    work here."""
    o64 = tl.arange(0, 64)
    bos, rows, G, g_last, kc, vc, coef = _chunk_tiles(
        k, v, g, ct, chunk_bos, chunk_len, cg, i_h, i_hv, offs_k, offs_v, H, HV, K, V, CT_TILES
    )
    kd = kc.dtype
    selected = (tl.load(m_row + c) != 0).to(tl.float32)
    if KS_CORRECTION:  # walk_correction "ks": U' = Ct (V − z e^G ⊙ K S), 1.5 MFLOP instead of 2.5, a longer chain
        ks = _mm(kc, S.to(kd), IEEE)
        u = _mm(coef.to(kd), (vc.to(tl.float32) - selected * tl.exp(G)[:, None] * ks).to(kd), IEEE)
    else:  # "w": U' = Ct V − z (Ct e^G K) S, W independent of the state
        w = _mm((coef * tl.exp(G)[None, :]).to(kd), kc, IEEE)
        u = _mm(coef.to(kd), vc.to(kd), IEEE) - selected * _mm(w.to(kd), S.to(kd), IEEE)
    decayed = S * tl.exp(g_last)
    write = decayed + _mm(tl.trans(kc), (u * tl.exp(g_last - G)[:, None]).to(kd), IEEE)
    S_next = decayed + selected * (write - decayed)
    if WRITE_OUT:
        qc = tl.load(q + (bos + o64)[:, None] * (H * K) + i_h * K + offs_k[None, :], mask=rows[:, None], other=0.0)
        if HAS_SCORES:  # A_c stored by intra (or the scores kernel): one product per chunk-pair, not per V tile
            a = tl.load(_scores_tile(scores, cg, i_hv, HV, 64))  # in the input dtype, as the product takes it
        else:
            a = _causal_scores(_mm(qc, tl.trans(kc), IEEE), G)
        acc = tl.exp(G)[:, None] * _mm(qc, S_read.to(kd), IEEE) + _mm(a.to(kd), u.to(kd), IEEE)
        p_o = o + (bos + o64)[:, None] * (HV * V) + i_hv * V + offs_v[None, :]
        tl.store(p_o, (scale * acc).to(o.dtype.element_ty), mask=rows[:, None])
    return S_next, write


@triton.jit
def _segment_program(HV: tl.constexpr, NV: tl.constexpr):
    """``(segment, value head, V tile)`` of this program in a segment-major launch (``(segments · HV · NV,)``):
    the GPU starts programs in launch order, so a plan's segments, longest first, start first
    (``launch.plan_segments``)."""
    pid = tl.program_id(0)
    i_s = pid // (HV * NV)
    rest = pid % (HV * NV)
    return i_s, rest // NV, rest % NV


@triton.jit
def _state_tile(base_ptr, row, offs_k, offs_v, K: tl.constexpr, V: tl.constexpr):
    """Pointers of the ``[K, BV]`` tile (rows ``offs_k``, columns ``offs_v``) of state ``row`` of a ``[.., K, V]``
    state array (``row`` = sequence or segment × HV + value head)."""
    return base_ptr + (row.to(tl.int64) * K + offs_k[:, None]) * V + offs_v[None, :]


@triton.jit
def sparse_gdn_fwd_kernel_entry(
    k,
    v,
    g,
    ct,
    mask,
    prefix,
    h0,
    entry,
    seg_seq,
    seg_c0,
    seq_chunk0,
    chunk_bos,
    chunk_len,
    tau,
    P: tl.constexpr,
    CMAX: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_H0: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    IEEE: tl.constexpr,
    KS_CORRECTION: tl.constexpr,
    CT_TILES: tl.constexpr = False,
):
    """Entry state of every segment, ``entry [NS, HV, K, V]`` fp32: a walk (no output) from the warm-up start.
    ``CT_TILES``: ``ct`` is the Gluon walk's tiles ``[NC, HV, 128, 64]`` (scores, then the dense ``Ct``), which
    is all intra stores of the coefficients on that path; else the kept blocks ``[NC, HV, 7, 16, 16]``."""
    i_s, i_hv, i_v = _segment_program(HV, V // BV)
    i_h = i_hv // (HV // H)
    n_seq = tl.load(seg_seq + i_s)
    c0 = tl.load(seg_c0 + i_s)
    base = tl.load(seq_chunk0 + n_seq)
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    m_row = mask + (n_seq * P + i_h).to(tl.int64) * CMAX
    # Warm-up start: the latest chunk cw <= c0 with P[c0] − P[cw] <= −tau (binary search), else the sequence start.
    p_c0 = tl.load(prefix + (base + c0).to(tl.int64) * HV + i_hv)
    lo = tl.zeros_like(c0)
    hi = c0
    for _step in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi + 1) // 2
        p_mid = tl.load(prefix + (base + mid).to(tl.int64) * HV + i_hv)
        far = (p_c0 - p_mid) <= -tau
        lo = tl.where(far & (mid <= hi), mid, lo)
        hi = tl.where(far | (mid > hi), hi, mid - 1)
    p_lo = tl.load(prefix + (base + lo).to(tl.int64) * HV + i_hv)
    cw = tl.where((p_c0 - p_lo) <= -tau, lo, 0)
    S = tl.zeros([K, BV], dtype=tl.float32)
    if HAS_H0:
        p_h = _state_tile(h0, n_seq * HV + i_hv, offs_k, offs_v, K, V)
        S = tl.where(cw == 0, tl.load(p_h).to(tl.float32), S)
    for c in range(cw, c0):
        S = _chunk_step(
            k,
            k,
            v,
            g,
            ct,
            k,
            k,
            m_row,
            c,
            base + c,
            chunk_bos,
            chunk_len,
            S,
            S,
            1.0,
            i_h,
            i_hv,
            offs_k,
            offs_v,
            H,
            HV,
            K,
            V,
            BV,
            False,
            IEEE,
            KS_CORRECTION,
            False,
            CT_TILES,
        )[0]
    p_e = _state_tile(entry, i_s * HV + i_hv, offs_k, offs_v, K, V)
    tl.store(p_e, S)


@triton.jit
def sparse_gdn_fwd_kernel_fused(
    q,
    k,
    v,
    g,
    ct,
    mask,
    h0,
    entry,
    o,
    scores,
    ht,
    seg_seq,
    seg_c0,
    seg_c1,
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
    HAS_ENTRY: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    GROUPED: tl.constexpr,
    IEEE: tl.constexpr,
    KS_CORRECTION: tl.constexpr,
    HAS_SCORES: tl.constexpr,
):
    i_s, i_hv, i_v = _segment_program(HV, V // BV)
    i_h = i_hv // (HV // H)
    n_seq = tl.load(seg_seq + i_s)
    c0 = tl.load(seg_c0 + i_s)
    c1 = tl.load(seg_c1 + i_s)
    base = tl.load(seq_chunk0 + n_seq)
    n_chunks = tl.load(seq_nchunks + n_seq)
    offs_k = tl.arange(0, K)
    offs_v = i_v * BV + tl.arange(0, BV)
    m_row = mask + (n_seq * P + i_h).to(tl.int64) * CMAX

    S = _segment_start_state(entry, h0, i_s, n_seq, i_hv, offs_k, offs_v, HV, K, V, BV, HAS_ENTRY, HAS_H0)

    # The segment's own chunks (c0 is even): an odd chunk under grouped output reads the previous chunk's would-be
    # write, every other chunk the state entering it.
    write = S
    for c in range(c0, c1):
        S_read = S
        if GROUPED:
            odd = ((c - c0) % 2).to(tl.float32)
            S_read = S + odd * (write - S)
        S, write = _chunk_step(
            q,
            k,
            v,
            g,
            ct,
            o,
            scores,
            m_row,
            c,
            base + c,
            chunk_bos,
            chunk_len,
            S,
            S_read,
            scale,
            i_h,
            i_hv,
            offs_k,
            offs_v,
            H,
            HV,
            K,
            V,
            BV,
            True,
            IEEE,
            KS_CORRECTION,
            HAS_SCORES,
            False,
        )

    if STORE_FINAL:
        if c1 == n_chunks:
            p_ht = _state_tile(ht, n_seq * HV + i_hv, offs_k, offs_v, K, V)
            tl.store(p_ht, S)


@triton.jit
def sparse_gdn_fwd_kernel_scores(
    q,
    k,
    g,
    scores,
    chunk_bos,
    chunk_len,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    IEEE: tl.constexpr,
    ROWS: tl.constexpr = 64,
    FAST_EXP: tl.constexpr = False,
):
    """The walk's intra-chunk scores ``A_c = Q_c K_cᵀ ⊙ e^{G_i − G_j} ⊙ causal`` of every (chunk, value head),
    rows 0-63 of ``scores [NC, HV, ROWS, 64]`` in the input dtype: one program per (chunk, head pair) forms ``Q Kᵀ``
    once for the pair's value heads, where the walk would form it once per value head and V tile. The op has intra
    store them (``intra_forward(q=, scores=)``, the same body in the same pass over the keys); this kernel serves
    callers of the main pass that do not pass them. ``FAST_EXP``: the decays by ``ex2.approx`` as intra forms them on
    the GPU (``intra_forward`` passes it for CUDA tensors), so that both write the same bits there."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    _store_chunk_scores(q, k, g, scores, i_c, i_h, bos, tl.load(chunk_len + i_c), H, HV, K, IEEE, ROWS, FAST_EXP)
