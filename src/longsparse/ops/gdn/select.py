"""SparseGDN event selection on the GPU: the specification's selector (``spec/select.py``) in three Triton launches.

The same decisions as the specification, on the same inputs (tail scores s and chunk decays γ from intra.py, the
output gate for visibility), without host synchronisation and with a launch count that does not grow with the
sequence length (the torch specification issues ~800 small operations per call):

1. ``head_stats``  per (sequence, value head): ‖s_·,h‖₂; the lifetime L_h = Σ_{j=1}^{C−2} r_h^j from the mean
   retention r_h of the last ``window`` chunks; the sampled gate energy η_h (positions 8/24/40/56, coordinate
   73(4c + a) mod V); on request the main pass's float64 decay prefix P_c = Σ_{j<c} γ_j (it reads every γ anyway).
2. ``pair_rank``   per (sequence, pair): the ranking score q_c of every middle chunk, one sort of the chunks by
   (q_c, lower index first) packed into one int64 key, the three tier thresholds (the key of the (k_ℓ − 2)-th middle
   chunk) and the upgrade gains Δ_L→M, Δ_M→H of Eq. 12 with the visibility G_h = sqrt(η_h / mean η).
3. ``mask``        per (sequence, pair): the sequence's tiers — x = Δ / mean Δ over the pairs, n_H = argmax
   B(x_H, n_H) over the table, n_M likewise on the remaining pairs (Eqs. 13–14), taken by every pair's program
   (P gains: cheaper than a launch of its own) —, then the pair's mask: anchors plus the middle chunks whose key
   reaches its tier's threshold; the "random" ablation re-ranks with the specification's 32-bit hash here.

Chunks are sorted in one register tile per (sequence, pair): sequences up to ``MAX_SORT_CHUNKS`` chunks run here;
longer ones use the torch specification (:func:`supports`).

Batches of short sequences (at most ``SHORT_CHUNKS`` chunks, 8K tokens) can take all three steps in one launch
instead, one program per sequence (:func:`sparse_gdn_select_kernel_short`; ``SparseGDNConfig.select_kernel``):
there a call is bound by the host's launches, not by the selector's work. Same decisions (the interpreter tests
check both forms against the specification).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..._optional import require
from .._launch import fast
from ..sparse_attn.launch import next_pow2  # plain Python: triton.next_power_of_2 costs ~5 µs of host time per call
from .config import SparseGDNConfig
from .spec.layout import ChunkLayout
from .spec.select import Selection, fixed_tier_counts, tier_sizes, tier_table

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402

MAX_SORT_CHUNKS = 8192
SHORT_CHUNKS = 128
"""The longest sequence, in chunks (8K tokens), the one-launch selector (:func:`sparse_gdn_select_kernel_short`)
takes."""
MODES = {"adaptive": 0, "random": 1, "all": 2, "fixed_tiers": 3}


def auto_takes_one_launch(layout: ChunkLayout) -> bool:
    """``select_kernel="auto"``: the one-launch selector for a single sequence of at most :data:`SHORT_CHUNKS`
    chunks, the three launches (whose programs spread over the GPU) otherwise. H200, 2026-12-02
    (``benchmarks/tuning/2026-12-02b/select_side_by_side.json``, the whole op): one sequence of 2K / 4K / 8K tokens
    1.26 / 1.30 / 1.51× faster with one launch (the call is bound by the host's launches); 2 × 4K, 4 × 4K, 8 × 8K
    0.89 / 0.92 / 0.95× (its one program per sequence does serially what the three launches spread out)."""
    return layout.N == 1 and layout.Cmax <= SHORT_CHUNKS


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
    snorm,
    life,
    eta,
    count,
    prefix,
    HV: tl.constexpr,
    V: tl.constexpr,
    WINDOW: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_PREFIX: tl.constexpr,
    BC: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_hv = tl.program_id(1)
    c0 = tl.load(seq_chunk0 + i_n)
    C = tl.load(seq_nchunks + i_n)
    o_c = tl.arange(0, BC)
    o_a = tl.arange(0, 4)
    ss = tl.zeros([BC], dtype=tl.float32)
    rr = tl.zeros([BC], dtype=tl.float32)
    ee = tl.zeros([BC, 4], dtype=tl.float32)
    nn = tl.zeros([BC, 4], dtype=tl.float32)
    carry = tl.sum(tl.zeros([BC], dtype=tl.float64), 0)  # P at the block's first chunk
    for start in range(0, C, BC):
        c = start + o_c
        ok = c < C
        cg = (c0 + c).to(tl.int64)
        s = tl.load(score + cg * HV + i_hv, mask=ok, other=0.0)
        ss += s * s
        gm = tl.load(gamma + cg * HV + i_hv, mask=ok, other=0.0)
        rr += tl.where(ok & (c >= C - WINDOW), tl.exp(gm), 0.0)
        if HAS_PREFIX:  # P_c = Σ_{j<c} γ_j in float64, the exclusive scan written as launch.decay_prefix forms it
            g64 = gm.to(tl.float64)
            tl.store(prefix + cg * HV + i_hv, carry + tl.cumsum(g64, 0) - g64, mask=ok)
            carry += tl.sum(g64, 0)
        if HAS_GATE:
            bos = tl.load(chunk_bos + cg, mask=ok, other=0).to(tl.int64)
            n = tl.load(chunk_len + cg, mask=ok, other=0)
            pos = 8 + 16 * o_a[None, :]
            present = ok[:, None] & (pos < n[:, None])
            coord = (73 * (4 * c[:, None] + o_a[None, :])) % V
            z = tl.load(gate + ((bos[:, None] + pos) * HV + i_hv) * V + coord, mask=present, other=0.0).to(tl.float32)
            w = tl.load(gate_w + coord, mask=present, other=0.0).to(tl.float32)
            e = w * z * tl.sigmoid(z)
            ee += tl.where(present, e * e, 0.0)
            nn += present.to(tl.float32)
    out = i_n * HV + i_hv
    tl.store(snorm + out, tl.sqrt(tl.sum(ss, 0)))
    r = tl.sum(rr, 0) / tl.maximum(tl.minimum(C, WINDOW), 1).to(tl.float32)
    # L = Σ_{j=1}^{C−2} r^j, summed term by term like the specification (r may be 1).
    L = tl.zeros([BC], dtype=tl.float32)
    for start in range(0, C - 2, BC):
        jj = start + 1 + o_c
        L += tl.where(jj <= C - 2, tl.exp2(tl.log2(r) * jj.to(tl.float32)), 0.0)
    tl.store(life + out, tl.sum(L, 0))
    if HAS_GATE:
        cnt = tl.sum(tl.sum(nn, 1), 0)
        tl.store(eta + out, tl.sum(tl.sum(ee, 1), 0) / tl.maximum(cnt, 1.0))
        tl.store(count + i_n, cnt)


@triton.jit
def _rank_keys(q, c, C):
    """int64 sort keys: (q's bits, lower chunk first) for the middle chunks 1..C−2, −1 elsewhere (q >= 0)."""
    bits = q.to(tl.int32, bitcast=True).to(tl.int64)
    key = (bits << 32) | (0xFFFFFFFF - c.to(tl.int64))
    return tl.where((c >= 1) & (c <= C - 2), key, -1)


@triton.jit
def _threshold(sorted_keys, k, CP: tl.constexpr):
    """The key of the (k − 2)-th best middle chunk (membership: key >= threshold); no middle chunk if k <= 2."""
    pick = tl.sum(tl.where(tl.arange(0, CP) == k - 3, sorted_keys, 0), 0)
    return tl.where(k >= 3, pick, 0x7FFFFFFFFFFFFFFF)


@triton.jit
def sparse_gdn_select_kernel_pair_rank(
    score,
    seq_chunk0,
    seq_nchunks,
    tier_k,
    snorm,
    life,
    eta,
    count,
    keys,
    thresholds,
    gains,
    HV: tl.constexpr,
    GS: tl.constexpr,
    P: tl.constexpr,
    HVP: tl.constexpr,
    CP: tl.constexpr,
    USE_VIS: tl.constexpr,
):
    i_n = tl.program_id(0)
    i_p = tl.program_id(1)
    c0 = tl.load(seq_chunk0 + i_n)
    C = tl.load(seq_nchunks + i_n)
    c = tl.arange(0, CP)
    ok = c < C
    o_h = tl.arange(0, HVP)
    if USE_VIS:  # eta and count exist only with a gate (head_stats writes them then)
        eta_all = tl.load(eta + i_n * HV + o_h, mask=o_h < HV, other=0.0)
        eta_mean = tl.sum(eta_all, 0) / HV
        vis_ok = (eta_mean > 0) & (tl.load(count + i_n) > 0)
    q = tl.zeros([CP], dtype=tl.float32)
    w = tl.zeros([CP], dtype=tl.float32)
    for j in tl.static_range(GS):
        h = i_p * GS + j
        s = tl.load(score + (c0 + c).to(tl.int64) * HV + h, mask=ok, other=0.0)
        nrm = tl.load(snorm + i_n * HV + h)
        q += tl.where(nrm > 0, s / tl.where(nrm > 0, nrm, 1.0), 0.0)
        vis = 1.0
        if USE_VIS:
            e = tl.load(eta + i_n * HV + h)
            vis = tl.where(vis_ok, tl.sqrt(e / tl.where(vis_ok, eta_mean, 1.0)), 1.0)
        w += s * (tl.load(life + i_n * HV + h) * vis)
    q = q / GS
    key = _rank_keys(q, c, C)
    tl.store(keys + (i_n * P + i_p).to(tl.int64) * CP + c, key)
    sk = tl.sort(key, 0, descending=True)
    k_low = tl.load(tier_k + i_n * 3 + 0)
    k_mid = tl.load(tier_k + i_n * 3 + 1)
    k_high = tl.load(tier_k + i_n * 3 + 2)
    t_low = _threshold(sk, k_low, CP)
    t_mid = _threshold(sk, k_mid, CP)
    t_high = _threshold(sk, k_high, CP)
    base = (i_n * P + i_p) * 3
    tl.store(thresholds + base + 0, t_low)
    tl.store(thresholds + base + 1, t_mid)
    tl.store(thresholds + base + 2, t_high)
    in_low = key >= t_low
    in_mid = key >= t_mid
    in_high = key >= t_high
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


def supports(layout: ChunkLayout) -> str | None:
    """None if the GPU selector covers this layout, else why not."""
    if layout.Cmax > MAX_SORT_CHUNKS:
        return f"a sequence of {layout.Cmax} chunks exceeds the selector's one-tile sort ({MAX_SORT_CHUNKS} chunks)"
    return None


@functools.lru_cache(maxsize=32)
def _table_host(pairs: int, ratios: tuple[float, float, float]) -> tuple[tuple[int, ...], ...]:
    """The tier table as rows (n_H, n_M candidates..., -1 padding)."""
    table = tier_table(pairs, ratios)
    width = max(len(m) for m in table.values())
    return tuple((h, *m, *([-1] * (width - len(m)))) for h, m in table.items())


def tier_k_tensor(layout: ChunkLayout, ratios: tuple[float, float, float]) -> torch.Tensor:
    """``[N, 3]`` int32 on the layout's device: k_ℓ (low, mid, high) of every sequence (:func:`tier_sizes`, computed
    where the chunk counts are: nothing read back to the host)."""
    return tier_sizes(layout.chunks_per_seq, tuple(ratios)).to(torch.int32)


def tier_table_tensor(pairs: int, ratios: tuple[float, float, float], device) -> torch.Tensor:
    """The tier table rows of :func:`_table_host` as an int32 tensor on ``device`` (what the mask kernel reads)."""
    return torch.tensor(_table_host(pairs, tuple(ratios)), dtype=torch.int32, device=device)


@dataclass(frozen=True)
class ChunkIndex:
    """The layout's per-sequence and per-chunk indices as the kernels read them, int32 on the device:
    ``seq_chunk0``, ``seq_nchunks`` ``[N]`` (first chunk, chunk count) and ``chunk_bos``, ``chunk_len`` ``[NC]`` (first
    token, valid tokens). Built once per launch plan: four conversions fewer per call."""

    seq_chunk0: torch.Tensor
    seq_nchunks: torch.Tensor
    chunk_bos: torch.Tensor
    chunk_len: torch.Tensor

    @classmethod
    def of(cls, layout: ChunkLayout) -> ChunkIndex:
        return cls(
            layout.seq_chunk_offsets[:-1].int(),
            layout.chunks_per_seq.int(),
            layout.token_index[:, 0].int(),
            layout.chunk_len.int(),
        )


def select_events_gpu(
    layout: ChunkLayout,
    score: torch.Tensor,
    gamma: torch.Tensor,
    group: int,
    config: SparseGDNConfig,
    gate: torch.Tensor | None = None,
    gate_norm_weight: torch.Tensor | None = None,
    *,
    tier_k: torch.Tensor | None = None,
    table: torch.Tensor | None = None,
    index: ChunkIndex | None = None,
    details: bool = True,
    decay_prefix: torch.Tensor | None = None,
    short: bool | None = False,
) -> Selection:
    """The specification's :func:`~longsparse.ops.gdn.spec.select.select_events` on the GPU.

    score, gamma: ``[NC, HV]`` float32 (intra.py's layout). The returned Selection carries mask, tier, tier_k,
    n_high, n_mid and the normalised gains; rank scores, lifetimes and visibilities are left as None (the statistics
    do not need them). ``tier_k`` (:func:`tier_k_tensor`), ``table`` (:func:`tier_table_tensor`) and ``index``
    (:class:`ChunkIndex`): as kept by the caller's launch plan (default: built here). ``details=False`` returns the
    mask alone (every other field None): what the main pass reads; with details one conversion (the tier sizes to
    int64) follows the kernels — the mask kernel writes tiers, tier counts and normalised gains as the specification
    holds them. ``decay_prefix``: a ``[NC, HV]`` float64 buffer that the first kernel fills with the sequence-local
    exclusive prefix of ``gamma`` (what :func:`~longsparse.ops.gdn.launch.decay_prefix` computes), since it reads
    every chunk decay of every sequence anyway. ``short``: True — the one-launch selector
    (:func:`sparse_gdn_select_kernel_short`; refused where a sequence has more than :data:`SHORT_CHUNKS` chunks);
    None — it where :func:`auto_takes_one_launch` (one sequence of at most :data:`SHORT_CHUNKS` chunks); False — the
    three launches (``SparseGDNConfig.select_kernel`` "one", "auto", "three"). The same decisions either way.
    """
    dev = score.device
    NC, HV = score.shape
    P = HV // group
    N, Cmax = layout.N, max(layout.Cmax, 1)
    CP = next_pow2(Cmax)
    if tier_k is None:
        tier_k = tier_k_tensor(layout, config.tier_ratios)
    index = index or ChunkIndex.of(layout)
    seq_chunk0, seq_nchunks = index.seq_chunk0, index.seq_nchunks
    chunk_bos, chunk_len = index.chunk_bos, index.chunk_len
    if short is None:
        short = auto_takes_one_launch(layout)
    elif short and Cmax > SHORT_CHUNKS:
        raise ValueError(
            f"select_events_gpu: short=True takes sequences of at most {SHORT_CHUNKS} chunks, the longest has {Cmax}"
        )
    use_gate = gate is not None and config.visibility
    f32 = dict(dtype=torch.float32, device=dev)
    V = gate.shape[-1] if use_gate else 1
    if gate_norm_weight is None and use_gate:
        gate_norm_weight = torch.ones(V, **f32)
    gate_flat = gate.reshape(-1, HV, V) if use_gate else score
    rows = _table_host(P, tuple(config.tier_ratios))
    if table is None:
        table = tier_table_tensor(P, config.tier_ratios, dev)
    fixed = (
        fixed_tier_counts(config.fixed_tiers, P, config.tier_ratios) if config.selection == "fixed_tiers" else (0, 0)
    )
    mask = torch.empty(N, P, Cmax, dtype=torch.uint8, device=dev)
    if details:  # int64 as the specification's Selection holds them: the statistics need no conversion launches
        tier = torch.empty(N, P, dtype=torch.int64, device=dev)
        n_high = torch.empty(N, dtype=torch.int64, device=dev)
        n_mid = torch.empty(N, dtype=torch.int64, device=dev)
        x = torch.empty(N, P, 2, **f32)
    else:  # not written
        tier = n_high = n_mid = x = mask
    life = torch.empty(N, HV, **f32) if details or not short else None
    decisions = dict(
        P=P,
        PP=max(next_pow2(P), 2),
        NH=len(rows),
        NM=len(rows[0]) - 1,
        CP=CP,
        CMAX=Cmax,
        MODE=MODES[config.selection],
        FIXED_HIGH=fixed[0],
        FIXED_MID=fixed[1],
        DETAILS=details,
    )
    if short:
        fast(sparse_gdn_select_kernel_short)[(N,)](
            score,
            gamma,
            gate_flat,
            gate_norm_weight if use_gate else score,
            seq_chunk0,
            seq_nchunks,
            chunk_bos,
            chunk_len,
            tier_k,
            table,
            score if decay_prefix is None else decay_prefix,
            mask,
            tier,
            n_high,
            n_mid,
            x,
            mask if life is None else life,
            config.seed,
            HV=HV,
            HVP=next_pow2(HV),
            V=V,
            GS=group,
            WINDOW=config.lifetime_window,
            HAS_GATE=use_gate,
            HAS_PREFIX=decay_prefix is not None,
            BC=32,
            **decisions,
        )
        return _selection(mask, tier, tier_k, n_high, n_mid, x, life, config, seq_nchunks, details)
    snorm, eta = (torch.empty(N, HV, **f32) for _ in range(2))
    count = torch.empty(N, **f32)  # eta and count: written by head_stats and read by pair_rank only with a gate
    fast(sparse_gdn_select_kernel_head_stats)[(N, HV)](
        score,
        gamma,
        gate_flat,
        gate_norm_weight if use_gate else score,
        seq_chunk0,
        seq_nchunks,
        chunk_bos,
        chunk_len,
        snorm,
        life,
        eta,
        count,
        score if decay_prefix is None else decay_prefix,
        HV=HV,
        V=V,
        WINDOW=config.lifetime_window,
        HAS_GATE=use_gate,
        HAS_PREFIX=decay_prefix is not None,
        BC=256,
    )
    keys = torch.empty(N, P, CP, dtype=torch.int64, device=dev)
    thresholds = torch.empty(N, P, 3, dtype=torch.int64, device=dev)
    gains = torch.empty(N, P, 2, **f32)
    fast(sparse_gdn_select_kernel_pair_rank)[(N, P)](
        score,
        seq_chunk0,
        seq_nchunks,
        tier_k,
        snorm,
        life,
        eta,
        count,
        keys,
        thresholds,
        gains,
        HV=HV,
        GS=group,
        P=P,
        HVP=next_pow2(HV),
        CP=CP,
        USE_VIS=use_gate,
    )
    fast(sparse_gdn_select_kernel_mask)[(N, P)](
        gains,
        table,
        keys,
        thresholds,
        tier_k,
        seq_nchunks,
        mask,
        tier,
        n_high,
        n_mid,
        x,
        config.seed,
        **decisions,
    )
    return _selection(mask, tier, tier_k, n_high, n_mid, x, life, config, seq_nchunks, details)


def _selection(mask, tier, tier_k, n_high, n_mid, x, life, config, seq_nchunks, details) -> Selection:
    """The kernels' outputs as the specification's :class:`Selection` (the mask alone without ``details``)."""
    if not details:
        fields = ("tier", "tier_k", "n_high", "n_mid", "rank_score", "lifetime", "visibility", "gain_mid", "gain_high")
        return Selection(mask=mask.view(torch.bool), **dict.fromkeys(fields))
    if config.selection == "all":
        tier_k = seq_nchunks[:, None].expand(-1, 3)
    return Selection(
        mask=mask.view(torch.bool),
        tier=tier,
        tier_k=tier_k.long(),
        n_high=n_high,
        n_mid=n_mid,
        rank_score=None,
        lifetime=life,
        visibility=None,
        gain_mid=x[..., 0],
        gain_high=x[..., 1],
    )
