"""SparseGDN event selection on the GPU, its kernels (launched by ``select.select_events_gpu``): the specification's
selector (``spec/select.py``) in three Triton launches.

The same decisions as the specification, on the same inputs (tail scores s and chunk decays γ from intra.py, the
output gate for visibility), without host synchronisation and with a launch count that does not grow with the
sequence length (the torch specification issues ~800 small operations per call):

1. ``head_stats``  per (sequence, value head, block of ``SelectorBlocks.stats`` chunks): the block's sums of s², of e^γ
   over the last ``window`` chunks and of the sampled gate energy (positions 8/24/40/56, coordinate 73(4c + a) mod
   V) with its sample count; on request the main pass's float64 decay prefix P_c = Σ_{j<c} γ_j (it reads every γ
   anyway; each block sums the blocks before it in order, so the values are the same whatever the block size).
2. ``pair_rank``   per (sequence, pair): the head totals from those sums (‖s_·,h‖₂, the retention r_h and lifetime
   L_h = Σ_{j=1}^{C−2} r_h^j, the energy η_h), the ranking score q_c of every middle chunk and its int64 key (q_c,
   lower index first), the three tier thresholds (the key of the (k_ℓ − 2)-th middle chunk: by one sort of the
   keys up to ``SelectorBlocks.sort_max`` chunks, by bisection on q's bits beyond, :func:`_tier_thresholds`) and
   the upgrade gains Δ_L→M, Δ_M→H of Eq. 12 with the visibility G_h = sqrt(η_h / mean η).
3. ``mask``        per (sequence, pair): the sequence's tiers — x = Δ / mean Δ over the pairs, n_H = argmax
   B(x_H, n_H) over the table, n_M likewise on the remaining pairs (Eqs. 13–14), taken by every pair's program
   (P gains: cheaper than a launch of its own) —, then the pair's mask: anchors plus the middle chunks whose key
   reaches its tier's threshold; the "random" ablation re-ranks with the specification's 32-bit hash here.

Why blocks and a bisection: at 128K tokens the head statistics in one program per head took 64 µs on the H200 and
a sort of the 2,048 keys of each (sequence, pair) 53 µs in its 16 programs; in blocks of chunks the head sums take
18 µs, and three thresholds need 31 counting steps over the keys rather than a sort: 25–29 µs (docs/kernel-log.md).
The steps are a chain of block-wide counts, 20–30 µs at
any length, so shorter sequences keep the sort (6 µs at 512 chunks). Ranking each chunk by counting the keys
above it, across (pair, block) programs, was slower than both (79 µs at 128K, 11 at 32K). Each pair's chunks are
one register tile: sequences up to ``MAX_SORT_CHUNKS`` chunks run here; longer ones use the torch specification
(``select.supports``).

Batches of short sequences (at most ``SHORT_CHUNKS`` chunks, 8K tokens) can take all three steps in one launch
instead, one program per sequence (:func:`sparse_gdn_select_kernel_short`; ``SparseGDNKernelConfig.select_kernel``):
there a call is bound by the host's launches, not by the selector's work. Same decisions (the interpreter tests
check both forms against the specification).
"""

from __future__ import annotations

from ...._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402


@triton.jit
def sparse_gdn_select_kernel_head_stats(
    score,
    gamma,
    gate,
    gate_w,
    seq_chunk0,
    seq_nchunks,
    chunk_bos,
    chunk_len,
    partial,
    prefix,
    HV: tl.constexpr,
    V: tl.constexpr,
    WINDOW: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_PREFIX: tl.constexpr,
    BC: tl.constexpr,
    NB: tl.constexpr,
):
    """Per (sequence, value head, block of ``BC`` chunks): the block's sums ``partial [N, HV, NB, 4]`` — Σ s²,
    Σ e^γ over the lifetime window, Σ e² of the sampled gate energy and its number of samples — and, on request,
    the block's part of the float64 decay prefix, whose carry (the blocks before) is summed block by block in order,
    so the values do not depend on the grid. A block past its sequence's end writes nothing; the readers
    (:func:`_head_totals`) take the sequence's blocks alone."""
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_b = tl.program_id(2)
    c0 = tl.load(seq_chunk0 + i_n)
    C = tl.load(seq_nchunks + i_n)
    o_c = tl.arange(0, BC)
    o_a = tl.arange(0, 4)
    c = i_b * BC + o_c
    ok = c < C
    cg = (c0 + c).to(tl.int64)
    s = tl.load(score + cg * HV + i_hv, mask=ok, other=0.0)
    gm = tl.load(gamma + cg * HV + i_hv, mask=ok, other=0.0)
    ss = tl.sum(s * s, 0)
    rr = tl.sum(tl.where(ok & (c >= C - WINDOW), tl.exp(gm), 0.0), 0)
    if HAS_PREFIX:  # P_c = Σ_{j<c} γ_j in float64, the exclusive scan written as launch.decay_prefix forms it
        carry = tl.sum(tl.zeros([BC], dtype=tl.float64), 0)
        for b in range(0, i_b):
            cb = b * BC + o_c
            before = tl.load(gamma + (c0 + cb).to(tl.int64) * HV + i_hv, mask=cb < C, other=0.0)
            carry += tl.sum(before.to(tl.float64), 0)
        g64 = gm.to(tl.float64)
        tl.store(prefix + cg * HV + i_hv, carry + tl.cumsum(g64, 0) - g64, mask=ok)
    ee = tl.sum(tl.zeros([BC], dtype=tl.float32), 0)
    nn = tl.sum(tl.zeros([BC], dtype=tl.float32), 0)
    if HAS_GATE:
        bos = tl.load(chunk_bos + cg, mask=ok, other=0).to(tl.int64)
        n = tl.load(chunk_len + cg, mask=ok, other=0)
        pos = 8 + 16 * o_a[None, :]
        present = ok[:, None] & (pos < n[:, None])
        coord = (73 * (4 * c[:, None] + o_a[None, :])) % V
        z = tl.load(gate + ((bos[:, None] + pos) * HV + i_hv) * V + coord, mask=present, other=0.0).to(tl.float32)
        w = tl.load(gate_w + coord, mask=present, other=0.0).to(tl.float32)
        e = w * z * tl.sigmoid(z)
        ee = tl.sum(tl.sum(tl.where(present, e * e, 0.0), 1), 0)
        nn = tl.sum(tl.sum(present.to(tl.float32), 1), 0)
    out = partial + ((i_n * HV + i_hv) * NB + i_b) * 4
    live = i_b * BC < C
    tl.store(out + 0, ss, mask=live)
    tl.store(out + 1, rr, mask=live)
    tl.store(out + 2, ee, mask=live)
    tl.store(out + 3, nn, mask=live)


@triton.jit
def _head_totals(partial, i_n, h, valid, C, HV: tl.constexpr, NB: tl.constexpr, BC: tl.constexpr):
    """Sums over the sequence's blocks of :func:`sparse_gdn_select_kernel_head_stats`' partials for the heads
    ``h [HP]`` (``valid [HP]``: the real ones): ``(Σ s², Σ e^γ in the window, Σ e², samples)``, each ``[HP]``."""
    o_b = tl.arange(0, NB)
    at = partial + ((i_n * HV + h)[:, None] * NB + o_b[None, :]) * 4
    live = valid[:, None] & (o_b * BC < C)[None, :]
    return (
        tl.sum(tl.load(at + 0, mask=live, other=0.0), 1),
        tl.sum(tl.load(at + 1, mask=live, other=0.0), 1),
        tl.sum(tl.load(at + 2, mask=live, other=0.0), 1),
        tl.sum(tl.load(at + 3, mask=live, other=0.0), 1),
    )


@triton.jit
def _lifetimes(r, C, HP: tl.constexpr, BL: tl.constexpr):
    """L = Σ_{j=1}^{C−2} r^j for each entry of ``r [HP]``, summed term by term like the specification (r may be
    1)."""
    o = tl.arange(0, BL)
    L = tl.zeros([HP, BL], dtype=tl.float32)
    for start in range(0, C - 2, BL):
        jj = start + 1 + o
        L += tl.where((jj <= C - 2)[None, :], tl.exp2(tl.log2(r)[:, None] * jj.to(tl.float32)[None, :]), 0.0)
    return tl.sum(L, 1)


@triton.jit
def _rank_keys(q, c, C):
    """int64 sort keys: (q's bits, lower chunk first) for the middle chunks 1..C−2, −1 elsewhere (q >= 0)."""
    bits = q.to(tl.int32, bitcast=True).to(tl.int64)
    key = (bits << 32) | (0xFFFFFFFF - c.to(tl.int64))
    return tl.where((c >= 1) & (c <= C - 2), key, -1)


@triton.jit
def _pick(x, o_g, j):
    """Entry ``j`` of the vector ``x`` (indices ``o_g``), as a scalar."""
    return tl.sum(tl.where(o_g == j, x, 0), 0)


@triton.jit
def _pair_scores(score, c0, c, C, norm, o_g, i_p, HV: tl.constexpr, GS: tl.constexpr):
    """q_c of chunks ``c`` for pair ``i_p``: the mean over its ``GS`` heads of s_c,h / ‖s_·,h‖₂ (``norm [GSP]``; a
    head whose scores are all 0 adds 0), added head by head; 0 past the sequence's end."""
    ok = c < C
    q = tl.zeros(c.shape, dtype=tl.float32)
    for j in tl.static_range(GS):
        s = tl.load(score + (c0 + c).to(tl.int64) * HV + i_p * GS + j, mask=ok, other=0.0)
        nrm = _pick(norm, o_g, j)
        q += tl.where(nrm > 0, s / tl.where(nrm > 0, nrm, 1.0), 0.0)
    return q / GS


@triton.jit
def _threshold(sorted_keys, k, CP: tl.constexpr):
    """The key of the (k − 2)-th best middle chunk (membership: key >= threshold); no middle chunk if k <= 2."""
    pick = tl.sum(tl.where(tl.arange(0, CP) == k - 3, sorted_keys, 0), 0)
    return tl.where(k >= 3, pick, 0x7FFFFFFFFFFFFFFF)


@triton.jit
def _tier_thresholds(q, c, middle, m, TP: tl.constexpr):
    """The int64 key (:func:`_rank_keys`) of the m-th best middle chunk for each target ``m [TP]`` (the key of the
    (k − 2)-th one for tier size k; membership: key >= threshold; no middle chunk where m <= 0), without a sort:
    the m-th largest q by bisection over its 31 value bits (q >= 0, so its bits order as its values), then among
    the chunks tied at that q the lower indices first — the ``m − #{q > t}``-th tied chunk in chunk order."""
    bits = q.to(tl.int32, bitcast=True)
    lo = tl.zeros([TP], dtype=tl.int32)  # #{bits >= lo} >= m
    hi = tl.full([TP], 0x7FFFFFFF, tl.int32)  # #{bits >= hi} < m
    for _ in range(31):  # hi − lo halves each step: 2³¹ − 1 → 1
        mid = lo + ((hi - lo) >> 1)
        count = tl.sum((middle[:, None] & (bits[:, None] >= mid[None, :])).to(tl.int32), 0)
        lo = tl.where(count >= m, mid, lo)
        hi = tl.where(count >= m, hi, mid)
    above = tl.sum((middle[:, None] & (bits[:, None] > lo[None, :])).to(tl.int32), 0)
    tied = (middle[:, None] & (bits[:, None] == lo[None, :])).to(tl.int32)
    before = tl.cumsum(tied, 0) - tied  # tied chunks of lower index
    taken = (tied > 0) & (before < (m - above)[None, :])
    last = tl.max(tl.where(taken, c[:, None], -1), 0)
    key = (lo.to(tl.int64) << 32) | (0xFFFFFFFF - last.to(tl.int64))
    return tl.where(m >= 1, key, 0x7FFFFFFFFFFFFFFF)


@triton.jit
def sparse_gdn_select_kernel_pair_rank(
    score,
    seq_chunk0,
    seq_nchunks,
    tier_k,
    partial,
    life,
    keys,
    thresholds,
    gains,
    HV: tl.constexpr,
    GS: tl.constexpr,
    GSP: tl.constexpr,
    P: tl.constexpr,
    HVP: tl.constexpr,
    CP: tl.constexpr,
    NB: tl.constexpr,
    BC: tl.constexpr,
    WINDOW: tl.constexpr,
    USE_VIS: tl.constexpr,
    SORT: tl.constexpr,
):
    """Per (sequence, pair): the head totals from ``partial`` (‖s_·,h‖₂, r_h and the lifetime L_h, written to
    ``life [N, HV]``, and η_h), the ranking score q_c and key of every chunk (``keys [N, P, CP]``), the three
    tier thresholds (``thresholds [N, P, 3]``: by one sort of the keys where ``SORT``, else
    :func:`_tier_thresholds`) and the upgrade gains Δ_L→M, Δ_M→H (Eq. 12, ``gains [N, P, 2]``) with the visibility
    G_h = sqrt(η_h / mean η)."""
    i_n = tl.program_id(0)
    i_p = tl.program_id(1)
    c0 = tl.load(seq_chunk0 + i_n)
    C = tl.load(seq_nchunks + i_n)
    o_g = tl.arange(0, GSP)
    mine = o_g < GS
    heads = i_p * GS + o_g
    ss, rr, ee, nn = _head_totals(partial, i_n, heads, mine, C, HV, NB, BC)
    norm = tl.sqrt(ss)
    r = rr / tl.maximum(tl.minimum(C, WINDOW), 1).to(tl.float32)
    L = _lifetimes(r, C, GSP, 256)
    tl.store(life + i_n * HV + heads, L, mask=mine)
    weight = L
    if USE_VIS:  # the gate's sums exist only with a gate (head_stats writes them then)
        o_h = tl.arange(0, HVP)
        _, _, ee_all, nn_all = _head_totals(partial, i_n, o_h, o_h < HV, C, HV, NB, BC)
        eta_all = tl.where(o_h < HV, ee_all / tl.maximum(nn_all, 1.0), 0.0)
        eta_mean = tl.sum(eta_all, 0) / HV
        vis_ok = (eta_mean > 0) & (tl.max(nn_all, 0) > 0)
        eta = ee / tl.maximum(nn, 1.0)
        weight = L * tl.where(vis_ok, tl.sqrt(eta / tl.where(vis_ok, eta_mean, 1.0)), 1.0)
    c = tl.arange(0, CP)
    q = _pair_scores(score, c0, c, C, norm, o_g, i_p, HV, GS)
    key = _rank_keys(q, c, C)
    tl.store(keys + (i_n * P + i_p).to(tl.int64) * CP + c, key)
    o_t = tl.arange(0, 4)
    k = tl.load(tier_k + i_n * 3 + o_t, mask=o_t < 3, other=0)
    if SORT:  # short sequences: one sort of the keys is quicker than 31 steps of counting
        sk = tl.sort(key, 0, descending=True)
        thr = tl.where(
            o_t == 0,
            _threshold(sk, _pick(k, o_t, 0), CP),
            tl.where(o_t == 1, _threshold(sk, _pick(k, o_t, 1), CP), _threshold(sk, _pick(k, o_t, 2), CP)),
        )
    else:
        thr = _tier_thresholds(q, c, (c >= 1) & (c <= C - 2), k - 2, 4)
    tl.store(thresholds + (i_n * P + i_p) * 3 + o_t, thr, mask=o_t < 3)
    in_low = key >= _pick(thr, o_t, 0)
    in_mid = key >= _pick(thr, o_t, 1)
    in_high = key >= _pick(thr, o_t, 2)
    w = tl.zeros([CP], dtype=tl.float32)
    for j in tl.static_range(GS):
        s = tl.load(score + (c0 + c).to(tl.int64) * HV + i_p * GS + j, mask=c < C, other=0.0)
        w += s * _pick(weight, o_g, j)
    tl.store(gains + (i_n * P + i_p) * 2 + 0, tl.sum(tl.where(in_mid & ~in_low, w, 0.0), 0))
    tl.store(gains + (i_n * P + i_p) * 2 + 1, tl.sum(tl.where(in_high & ~in_mid, w, 0.0), 0))


@triton.jit
def _desc_rank(x, PP: tl.constexpr):
    """Rank of each entry by descending value, ties to the lower index (an O(P²) count; P is small)."""
    o = tl.arange(0, PP)
    xi = x[:, None]
    xj = x[None, :]
    before = (xj > xi) | ((xj == xi) & (o[None, :] < o[:, None]))
    return tl.sum(before.to(tl.int32), 1)


@triton.jit
def _split_score(x_desc, n, k, PP: tl.constexpr):
    """B(x, k) = k(n − k)/n (mean(x_1..k) − mean(x_k+1..n))², 0 unless 0 < k < n (Eq. 14)."""
    o = tl.arange(0, PP)
    x = tl.where(o < n, x_desc, 0.0)
    top = tl.sum(tl.where(o < k, x, 0.0), 0)
    total = tl.sum(x, 0)
    kf = k.to(tl.float32)
    nf = n.to(tl.float32)
    gap = top / tl.maximum(kf, 1.0) - (total - top) / tl.maximum(nf - kf, 1.0)
    return tl.where((k > 0) & (k < n), kf * (nf - kf) / tl.maximum(nf, 1.0) * gap * gap, 0.0)


@triton.jit
def _by_rank(x, rank, PP: tl.constexpr):
    """``x`` reordered so that position r holds the entry of rank r."""
    o = tl.arange(0, PP)
    return tl.sum(tl.where(rank[None, :] == o[:, None], x[None, :], 0.0), 1)


@triton.jit
def _sequence_tiers(
    g_mid, g_high, table,
    P: tl.constexpr, PP: tl.constexpr, NH: tl.constexpr, NM: tl.constexpr, MODE: tl.constexpr,
    FIXED_HIGH: tl.constexpr, FIXED_MID: tl.constexpr,
):  # fmt: skip
    """A sequence's tier decision from its pairs' upgrade gains ``g_mid, g_high [PP]`` (0 past the P pairs):
    ``(tier [PP], n_high, n_mid, x_mid [PP], x_high [PP])`` (x: the gains over their mean, as the statistics report
    them)."""
    o = tl.arange(0, PP)
    valid = o < P
    m_mid = tl.sum(g_mid, 0) / P
    m_high = tl.sum(g_high, 0) / P
    x_mid_stat = tl.where(m_mid > 0, g_mid / tl.where(m_mid > 0, m_mid, 1.0), 0.0)
    x_high_stat = tl.where(m_high > 0, g_high / tl.where(m_high > 0, m_high, 1.0), 0.0)
    x_mid = tl.where(valid, x_mid_stat, float("-inf"))
    x_high = tl.where(valid, x_high_stat, float("-inf"))
    r_high = _desc_rank(x_high, PP)
    if MODE == 3:
        n_high = tl.full([], FIXED_HIGH, tl.int32)
        n_mid = tl.full([], FIXED_MID, tl.int32)
    else:
        xh = _by_rank(x_high, r_high, PP)
        best = tl.full([], -1.0, tl.float32)
        n_high = tl.full([], 0, tl.int32)
        for a in tl.static_range(NH):
            cand = tl.load(table + a * (NM + 1))
            b = _split_score(xh, tl.full([], P, tl.int32), cand, PP)
            take = b > best
            best = tl.where(take, b, best)
            n_high = tl.where(take, cand, n_high)
        row = tl.zeros([], dtype=tl.int32)
        for a in tl.static_range(NH):
            row = tl.where(tl.load(table + a * (NM + 1)) == n_high, a, row)
        rest = tl.where(r_high < n_high, float("-inf"), x_mid)
        xm = _by_rank(rest, _desc_rank(rest, PP), PP)
        best = tl.full([], float("-inf"), tl.float32)
        n_mid = tl.full([], 0, tl.int32)
        for m in tl.static_range(NM):
            cand = tl.load(table + row * (NM + 1) + 1 + m)
            b = tl.where(cand >= 0, _split_score(xm, P - n_high, tl.maximum(cand, 0), PP), float("-inf"))
            take = b > best
            best = tl.where(take, b, best)
            n_mid = tl.where(take, cand, n_mid)
    high = r_high < n_high
    rest = tl.where(high, float("-inf"), x_mid)
    mid = ~high & (_desc_rank(rest, PP) < n_mid)
    t = tl.where(high, 2, tl.where(mid, 1, 0))
    if MODE == 2:  # every pair keeps every chunk: all high, as the specification reports it
        t = tl.full([PP], 2, tl.int32)
        n_high = tl.full([], P, tl.int32)
        n_mid = tl.full([], 0, tl.int32)
    return t, n_high, n_mid, x_mid_stat, x_high_stat


@triton.jit
def _mix32(x):
    """The specification's 32-bit hash (random ablation), on uint32."""
    x = ((x >> 16) ^ x) * 0x45D9F3B
    x = ((x >> 16) ^ x) * 0x45D9F3B
    return (x >> 16) ^ x


@triton.jit
def sparse_gdn_select_kernel_mask(
    gains,
    table,
    keys,
    thresholds,
    tier_k,
    seq_nchunks,
    mask,
    tier,
    n_high_out,
    n_mid_out,
    x_out,
    seed,
    P: tl.constexpr,
    PP: tl.constexpr,
    NH: tl.constexpr,
    NM: tl.constexpr,
    CP: tl.constexpr,
    CMAX: tl.constexpr,
    MODE: tl.constexpr,
    FIXED_HIGH: tl.constexpr,
    FIXED_MID: tl.constexpr,
    DETAILS: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_p = tl.program_id(1)
    # Every pair's program takes its sequence's tier decision (P gains, a few hundred operations): one launch
    # fewer than a per-sequence tiers kernel ahead of the mask.
    o = tl.arange(0, PP)
    g_mid = tl.load(gains + (i_n * P + o) * 2 + 0, mask=o < P, other=0.0)
    g_high = tl.load(gains + (i_n * P + o) * 2 + 1, mask=o < P, other=0.0)
    tiers, n_high, n_mid, x_mid, x_high = _sequence_tiers(
        g_mid, g_high, table, P, PP, NH, NM, MODE, FIXED_HIGH, FIXED_MID
    )
    if DETAILS:
        if i_p == 0:
            valid = o < P
            tl.store(tier + i_n * P + o, tiers.to(tier.dtype.element_ty), mask=valid)
            tl.store(n_high_out + i_n, n_high.to(n_high_out.dtype.element_ty))
            tl.store(n_mid_out + i_n, n_mid.to(n_mid_out.dtype.element_ty))
            tl.store(x_out + (i_n * P + o) * 2 + 0, x_mid, mask=valid)
            tl.store(x_out + (i_n * P + o) * 2 + 1, x_high, mask=valid)
    t = tl.sum(tl.where(o == i_p, tiers, 0), 0)
    C = tl.load(seq_nchunks + i_n)
    c = tl.arange(0, CP)
    if MODE == 1:
        s32 = _mix32(seed.to(tl.uint32))
        h = _mix32(_mix32(s32 ^ i_p.to(tl.uint32)) ^ c.to(tl.uint32))
        u = (h.to(tl.float64) / 4294967296.0).to(tl.float32)
        key = _rank_keys(u, c, C)
        k = tl.load(tier_k + i_n * 3 + t)
        thr = _threshold(tl.sort(key, 0, descending=True), k, CP)
    else:
        key = tl.load(keys + (i_n * P + i_p).to(tl.int64) * CP + c)
        thr = tl.load(thresholds + (i_n * P + i_p) * 3 + t)
    anchor = (c == 0) | (c == C - 1)
    keep = (c < C) & (anchor | (key >= thr))
    if MODE == 2:
        keep = c < C
    tl.store(mask + (i_n * P + i_p).to(tl.int64) * CMAX + c, keep.to(tl.uint8), mask=c < CMAX)


@triton.jit
def _row_thresholds(sorted_keys, k, CP: tl.constexpr):
    """:func:`_threshold` of every row of ``sorted_keys [PP, CP]``, row r taking its (k_r − 2)-th best middle chunk
    (``k [PP]``)."""
    pick = tl.sum(tl.where(tl.arange(0, CP)[None, :] == (k - 3)[:, None], sorted_keys, 0), 1)
    return tl.where(k >= 3, pick, 0x7FFFFFFFFFFFFFFF)


@triton.jit
def sparse_gdn_select_kernel_short(
    score,
    gamma,
    gate,
    gate_w,
    seq_chunk0,
    seq_nchunks,
    chunk_bos,
    chunk_len,
    tier_k,
    table,
    prefix,
    mask,
    tier,
    n_high_out,
    n_mid_out,
    x_out,
    life_out,
    seed,
    HV: tl.constexpr,
    HVP: tl.constexpr,
    V: tl.constexpr,
    GS: tl.constexpr,
    P: tl.constexpr,
    PP: tl.constexpr,
    WINDOW: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_PREFIX: tl.constexpr,
    NH: tl.constexpr,
    NM: tl.constexpr,
    CP: tl.constexpr,
    CMAX: tl.constexpr,
    MODE: tl.constexpr,
    FIXED_HIGH: tl.constexpr,
    FIXED_MID: tl.constexpr,
    DETAILS: tl.constexpr,
    BC: tl.constexpr,
):
    """The three launches above in one program per sequence, for sequences of at most ``CP`` chunks
    (:data:`SHORT_CHUNKS`): the head statistics of all value heads as ``[HVP, BC]`` tiles, every pair's ranking,
    sort and thresholds as ``[PP, CP]`` tiles, the tier decision and the masks — the same formulas, with the
    intermediate statistics kept in registers (``tl.gather`` takes each pair's heads from the per-head vectors).
    Two launches and seven buffers fewer: a short call is bound by the host's launches, not by this work.
    ``HAS_GATE`` here means the visibility factor is used (a gate and ``config.visibility``)."""
    i_n = tl.program_id(0)
    c0 = tl.load(seq_chunk0 + i_n)
    C = tl.load(seq_nchunks + i_n)
    # head statistics (sparse_gdn_select_kernel_head_stats), all heads at once
    o_h = tl.arange(0, HVP)
    heads = o_h < HV
    o_c = tl.arange(0, BC)
    ss = tl.zeros([HVP, BC], dtype=tl.float32)
    rr = tl.zeros([HVP, BC], dtype=tl.float32)
    ee = tl.zeros([HVP, BC], dtype=tl.float32)
    nn = tl.zeros([HVP, BC], dtype=tl.float32)
    carry = tl.zeros([HVP], dtype=tl.float64)  # P at the block's first chunk, per head
    for start in range(0, C, BC):
        cb = start + o_c
        in_seq = cb < C
        okb = heads[:, None] & in_seq[None, :]
        cg = (c0 + cb).to(tl.int64)
        at = cg[None, :] * HV + o_h[:, None]
        sb = tl.load(score + at, mask=okb, other=0.0)
        ss += sb * sb
        gm = tl.load(gamma + at, mask=okb, other=0.0)
        rr += tl.where(okb & (cb >= C - WINDOW)[None, :], tl.exp(gm), 0.0)
        if HAS_PREFIX:
            g64 = gm.to(tl.float64)
            tl.store(prefix + at, carry[:, None] + tl.cumsum(g64, 1) - g64, mask=okb)
            carry += tl.sum(g64, 1)
        if HAS_GATE:
            bos = tl.load(chunk_bos + cg, mask=in_seq, other=0).to(tl.int64)
            n = tl.load(chunk_len + cg, mask=in_seq, other=0)
            for a in tl.static_range(4):  # positions 8 / 24 / 40 / 56, coordinate 73 (4c + a) mod V
                pos = 8 + 16 * a
                present = okb & (pos < n)[None, :]
                coord = (73 * (4 * cb + a)) % V
                z = tl.load(gate + ((bos[None, :] + pos) * HV + o_h[:, None]) * V + coord[None, :], mask=present,
                            other=0.0).to(tl.float32)  # fmt: skip
                gw = tl.load(gate_w + coord, mask=in_seq, other=0.0).to(tl.float32)[None, :]
                e = gw * z * tl.sigmoid(z)
                ee += tl.where(present, e * e, 0.0)
                nn += present.to(tl.float32)
    snorm = tl.sqrt(tl.sum(ss, 1))
    r = tl.sum(rr, 1) / tl.maximum(tl.minimum(C, WINDOW), 1).to(tl.float32)
    L = tl.zeros([HVP, BC], dtype=tl.float32)
    for start in range(0, C - 2, BC):
        jj = start + 1 + o_c
        L += tl.where((jj <= C - 2)[None, :], tl.exp2(tl.log2(r)[:, None] * jj.to(tl.float32)[None, :]), 0.0)
    life = tl.sum(L, 1)
    # pair ranking (sparse_gdn_select_kernel_pair_rank), all pairs at once
    o_p = tl.arange(0, PP)
    pairs = o_p < P
    c = tl.arange(0, CP)
    ok = pairs[:, None] & (c < C)[None, :]
    if HAS_GATE:
        cnt = tl.sum(nn, 1)  # the same count in every head's row
        eta = tl.where(heads, tl.sum(ee, 1) / tl.maximum(cnt, 1.0), 0.0)
        eta_mean = tl.sum(eta, 0) / HV
        vis_ok = (eta_mean > 0) & (tl.max(cnt, 0) > 0)
    q = tl.zeros([PP, CP], dtype=tl.float32)
    w = tl.zeros([PP, CP], dtype=tl.float32)
    for j in tl.static_range(GS):
        h = tl.minimum(o_p * GS + j, HV - 1)  # head j of each pair (padded pairs: any head, masked off)
        s = tl.load(score + (c0 + c).to(tl.int64)[None, :] * HV + h[:, None], mask=ok, other=0.0)
        nrm = tl.gather(snorm, h, 0)
        q += tl.where((nrm > 0)[:, None], s / tl.where(nrm > 0, nrm, 1.0)[:, None], 0.0)
        vis = tl.full([PP], 1.0, tl.float32)
        if HAS_GATE:
            vis = tl.where(vis_ok, tl.sqrt(tl.gather(eta, h, 0) / tl.where(vis_ok, eta_mean, 1.0)), 1.0)
        w += s * (tl.gather(life, h, 0) * vis)[:, None]
    q = q / GS
    key = _rank_keys(q, c[None, :], C)
    sk = tl.sort(key, 1, descending=True)
    k_low = tl.load(tier_k + i_n * 3 + 0)
    k_mid = tl.load(tier_k + i_n * 3 + 1)
    k_high = tl.load(tier_k + i_n * 3 + 2)
    none = tl.zeros([PP], dtype=tl.int32)
    t_low = _row_thresholds(sk, none + k_low, CP)
    t_mid = _row_thresholds(sk, none + k_mid, CP)
    t_high = _row_thresholds(sk, none + k_high, CP)
    in_low = key >= t_low[:, None]
    in_mid = key >= t_mid[:, None]
    in_high = key >= t_high[:, None]
    g_mid = tl.where(pairs, tl.sum(tl.where(in_mid & ~in_low, w, 0.0), 1), 0.0)
    g_high = tl.where(pairs, tl.sum(tl.where(in_high & ~in_mid, w, 0.0), 1), 0.0)
    # tiers and masks (sparse_gdn_select_kernel_mask)
    tiers, n_high, n_mid, x_mid, x_high = _sequence_tiers(
        g_mid, g_high, table, P, PP, NH, NM, MODE, FIXED_HIGH, FIXED_MID
    )
    if DETAILS:
        tl.store(life_out + i_n * HV + o_h, life, mask=heads)
        tl.store(tier + i_n * P + o_p, tiers.to(tier.dtype.element_ty), mask=pairs)
        tl.store(n_high_out + i_n, n_high.to(n_high_out.dtype.element_ty))
        tl.store(n_mid_out + i_n, n_mid.to(n_mid_out.dtype.element_ty))
        tl.store(x_out + (i_n * P + o_p) * 2 + 0, x_mid, mask=pairs)
        tl.store(x_out + (i_n * P + o_p) * 2 + 1, x_high, mask=pairs)
    if MODE == 1:
        s32 = _mix32(seed.to(tl.uint32))
        hsh = _mix32(_mix32(s32 ^ o_p.to(tl.uint32))[:, None] ^ c.to(tl.uint32)[None, :])
        u = (hsh.to(tl.float64) / 4294967296.0).to(tl.float32)
        key = _rank_keys(u, c[None, :], C)
        k_t = tl.load(tier_k + i_n * 3 + tiers)
        thr = _row_thresholds(tl.sort(key, 1, descending=True), k_t, CP)
    else:
        thr = tl.where(tiers == 0, t_low, tl.where(tiers == 1, t_mid, t_high))
    anchor = (c == 0) | (c == C - 1)
    keep = (c < C)[None, :] & (anchor[None, :] | (key >= thr[:, None]))
    if MODE == 2:
        keep = (c < C)[None, :] & pairs[:, None]
    out = mask + (i_n * P + o_p).to(tl.int64)[:, None] * CMAX + c[None, :]
    tl.store(out, keep.to(tl.uint8), mask=pairs[:, None] & (c < CMAX)[None, :])
