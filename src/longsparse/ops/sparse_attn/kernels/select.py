"""Triton kernels of the block selectors (launched from ``sparse_attn.select``; semantics in ``naive.py``).

Three stages, shared by the InfLLM-V2 selector (``SOFTMAX=True``, G query heads per KV head) and the Forecast
selector (``SOFTMAX=False``, one vector per KV head), so that the two are measured with the same machinery:

* ``select_fwd_kernel_scores`` (prefill) — one program per tile of ``BT`` tokens and one KV head; its M dimension is
  the tile's ``BT·G`` (token, head) rows. With ``SOFTMAX`` a first sweep over the visible compressed keys computes
  each row's log-sum-exp (online, base 2); the scoring sweep recomputes the logits, turns them into probabilities,
  sums the G heads of each token, max-pools them onto blocks and writes the block scores of the candidate blocks
  only (causal, non-forced) to a float32 scratch row ``[NB]`` per token. The ``[T, N]`` compressed-grid scores never
  reach device memory.
* ``select_fwd_kernel_decode_lse`` / ``select_fwd_kernel_decode_scores`` — the same for one query token per
  sequence, split over chunks of blocks so that a small batch still fills the GPU (InfLLM-V2 first combines the
  chunks' partial log-sum-exps).
* ``select_fwd_kernel_topk`` — per query row: the forced blocks, then the ``budget − |forced|`` best candidates by an
  exact select over the order-preserving int32 image of the float32 scores (the row held in registers, one int32
  per block; an ARITY-ary search over the row's key range that stops once a count is exact), ties to the lower block
  index via a prefix count; writes the ascending, −1 padded list and, for prefill, the union plan of each tile of
  ``BT`` tokens consumed by the attention kernel.

Pooling onto blocks: block ``b`` takes the max over compressed positions ``[b·P − R1, b·P + P)``; a tile computes
the ``P`` positions of each of its blocks and the last ``R1`` positions of the block before it arrive by a shift
(``tl.gather``) within the tile and a carried value across tiles.
"""

import triton
import triton.language as tl


@triton.jit
def _pool_tile(ps, carry, BT: tl.constexpr, BN: tl.constexpr, P: tl.constexpr, R1: tl.constexpr):
    """``ps [BT, BN·P]`` compressed scores of blocks ``b0 … b0+BN−1`` -> block scores ``[BT, BN]`` and the new carry."""
    ps3 = tl.reshape(ps, [BT, BN, P])
    gmax = tl.max(ps3, axis=2)
    in_tail = tl.arange(0, P)[None, None, :] >= P - R1
    tail = tl.max(tl.where(in_tail, ps3, float("-inf")), axis=2)
    col = tl.arange(0, BN)[None, :] + tl.zeros([BT, BN], dtype=tl.int32)
    prev = tl.gather(tail, tl.maximum(col - 1, 0), axis=1)
    prev = tl.where(col == 0, carry[:, None], prev)
    new_carry = tl.max(tl.where(col == BN - 1, tail, float("-inf")), axis=1)
    return tl.maximum(gmax, prev), new_carry


@triton.jit
def select_fwd_kernel_scores(
    q_ptr,
    kc_ptr,
    s_ptr,
    T,
    N,
    t_begin,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_sb,
    stride_sh,
    stride_st,
    scale_log2,
    HKV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
    BLOCK: tl.constexpr,
    KS: tl.constexpr,
    ST: tl.constexpr,
    P: tl.constexpr,
    R1: tl.constexpr,
    INIT: tl.constexpr,
    LOCAL: tl.constexpr,
    SOFTMAX: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BM: tl.constexpr,
    BNC: tl.constexpr,
):
    # Rows are (token, head) pairs, BM = BT·GP with GP = next_pow2(G) per token (padding rows masked out);
    # BNC = BN·P compressed positions per tile.
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    t0 = t_begin + i_t * BT
    o_m = tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    tok = t0 + o_m // GP
    m_row = (tok < T) & (o_m % GP < G)
    p_q = q_ptr + i_b.to(tl.int64) * stride_qb + tok.to(tl.int64)[:, None] * stride_qt
    p_q += (i_h * G + o_m % GP).to(tl.int64)[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_row[:, None] & m_d[None, :], other=0.0)
    n_vis = tl.maximum((tok + 1 - KS + ST) // ST, 0)
    n_vis = tl.where(m_row, n_vis, 0)
    tok_t = t0 + tl.arange(0, BT)
    n_vis_t = tl.where(tok_t < T, tl.maximum((tok_t + 1 - KS + ST) // ST, 0), 0)
    p_kc = kc_ptr + i_b.to(tl.int64) * stride_kb + i_h.to(tl.int64) * stride_kh
    o_n = tl.arange(0, BNC)

    b_lse = tl.zeros([BM], dtype=tl.float32)
    if SOFTMAX:
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        n_hi = tl.max(n_vis, axis=0)
        for j0 in range(0, n_hi, BNC):
            o_j = j0 + o_n
            b_k = tl.load(
                p_kc + o_j.to(tl.int64)[:, None] * stride_kn + o_d[None, :],
                mask=(o_j < N)[:, None] & m_d[None, :],
                other=0.0,
            )
            b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION) * scale_log2
            b_s = tl.where(o_j[None, :] < n_vis[:, None], b_s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(b_s - m_safe[:, None]), axis=1)
            m_i = m_new
        b_lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), 0.0)

    qb = t0 // BLOCK
    nb_cand_end = tl.maximum(qb - LOCAL, 0)
    carry = tl.full([BT], float("-inf"), dtype=tl.float32)
    p_s = s_ptr + i_b.to(tl.int64) * stride_sb + i_h.to(tl.int64) * stride_sh
    row_s = (tok_t - t_begin).to(tl.int64) * stride_st
    for b0 in range(0, nb_cand_end, BN):
        o_j = b0 * P + o_n
        b_k = tl.load(
            p_kc + o_j.to(tl.int64)[:, None] * stride_kn + o_d[None, :],
            mask=(o_j < N)[:, None] & m_d[None, :],
            other=0.0,
        )
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
        if SOFTMAX:
            b_p = tl.where(o_j[None, :] < n_vis[:, None], tl.exp2(b_s * scale_log2 - b_lse[:, None]), 0.0)
            b_p = tl.sum(tl.reshape(b_p, [BT, GP, BNC]), axis=1)
        else:
            b_p = tl.reshape(b_s, [BT, BNC])
        b_p = tl.where(o_j[None, :] < n_vis_t[:, None], b_p, float("-inf"))
        b_blk, carry = _pool_tile(b_p, carry, BT, BN, P, R1)
        o_b = b0 + tl.arange(0, BN)
        m_store = (tok_t < T)[:, None] & (o_b[None, :] < nb_cand_end) & (o_b[None, :] >= INIT)
        tl.store(p_s + row_s[:, None] + o_b[None, :], b_blk, mask=m_store)


@triton.jit(do_not_specialize=["N", "NCH"])  # they change as sequences grow: no recompiles
def select_fwd_kernel_decode_lse(
    q_ptr,
    kc_ptr,
    len_ptr,
    m_ptr,
    l_ptr,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    scale_log2,
    N,
    NCH,
    HKV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    CB: tl.constexpr,
    BN: tl.constexpr,
    KS: tl.constexpr,
    ST: tl.constexpr,
    P: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BNC: tl.constexpr,
):
    i_bh, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_g = o_g < G
    p_q = q_ptr + i_b.to(tl.int64) * stride_qb + (i_h * G + o_g).to(tl.int64)[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_g[:, None] & m_d[None, :], other=0.0)
    pos = tl.load(len_ptr + i_b).to(tl.int32) - 1
    n_vis = tl.minimum(tl.maximum((pos + 1 - KS + ST) // ST, 0), N)
    p_kc = kc_ptr + i_b.to(tl.int64) * stride_kb + i_h.to(tl.int64) * stride_kh
    j_lo = i_c * CB * P
    j_hi = tl.minimum(j_lo + CB * P, n_vis)
    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    for j0 in range(j_lo, j_hi, BNC):
        o_j = j0 + tl.arange(0, BNC)
        b_k = tl.load(
            p_kc + o_j.to(tl.int64)[:, None] * stride_kn + o_d[None, :],
            mask=(o_j < j_hi)[:, None] & m_d[None, :],
            other=0.0,
        )
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION) * scale_log2
        b_s = tl.where((o_j < j_hi)[None, :], b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(b_s - m_safe[:, None]), axis=1)
        m_i = m_new
    o_part = (i_bh.to(tl.int64) * NCH + i_c) * GP + o_g
    tl.store(m_ptr + o_part, m_i)
    tl.store(l_ptr + o_part, l_i)


@triton.jit(do_not_specialize=["N", "NCH"])
def select_fwd_kernel_decode_scores(
    q_ptr,
    kc_ptr,
    len_ptr,
    m_ptr,
    l_ptr,
    s_ptr,
    idx_ptr,
    cnt_ptr,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_sb,
    stride_sh,
    stride_ib,
    stride_ih,
    scale_log2,
    N,
    NCH,
    HKV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    CB: tl.constexpr,
    BN: tl.constexpr,
    BLOCK: tl.constexpr,
    KS: tl.constexpr,
    ST: tl.constexpr,
    P: tl.constexpr,
    R1: tl.constexpr,
    INIT: tl.constexpr,
    LOCAL: tl.constexpr,
    DENSE_LEN: tl.constexpr,
    SOFTMAX: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BNC: tl.constexpr,
    FUSE_TOPK: tl.constexpr = False,
    NBP: tl.constexpr = 1,
    S: tl.constexpr = 1,
    SP: tl.constexpr = 1,
    BUDGET: tl.constexpr = 1,
    ARITY: tl.constexpr = 2,
    BITONIC: tl.constexpr = False,
    KP: tl.constexpr = 1,
):
    """Pooled candidate-block scores of one decode query row, blocks ``CB·i_c ..`` of row ``(b, kv head)`` into
    ``s_ptr``. ``FUSE_TOPK``: the row's last program to finish then selects its blocks into ``idx_ptr`` (the top-k
    kernel's work, :func:`_select_rows`, without its launch), counting the row's finished programs in ``cnt_ptr``
    (int32 per row, zero on entry; left zero)."""
    i_bh, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    seqlen = tl.load(len_ptr + i_b).to(tl.int32)
    pos = seqlen - 1
    qb = pos // BLOCK
    nb_cand_end = tl.maximum(qb - LOCAL, 0)
    b_lo = i_c * CB
    # A sequence below dense_len attends every causal block: nothing to score.
    b_hi = tl.where(seqlen < DENSE_LEN, b_lo, tl.minimum(b_lo + CB, nb_cand_end))
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_g = o_g < G
    p_q = q_ptr + i_b.to(tl.int64) * stride_qb + (i_h * G + o_g).to(tl.int64)[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_g[:, None] & m_d[None, :], other=0.0)
    n_vis = tl.minimum(tl.maximum((pos + 1 - KS + ST) // ST, 0), N)
    p_kc = kc_ptr + i_b.to(tl.int64) * stride_kb + i_h.to(tl.int64) * stride_kh

    b_lse = tl.zeros([GP], dtype=tl.float32)
    if SOFTMAX:
        # Merge the chunks' (max, sum) partials, 16 chunks at a time.
        m_all = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_all = tl.zeros([GP], dtype=tl.float32)
        for c0 in range(0, NCH, 16):
            o_ch = c0 + tl.arange(0, 16)
            o_part = (i_bh.to(tl.int64) * NCH + o_ch)[:, None] * GP + o_g[None, :]
            m_part = tl.load(m_ptr + o_part, mask=(o_ch < NCH)[:, None], other=float("-inf"))
            l_part = tl.load(l_ptr + o_part, mask=(o_ch < NCH)[:, None], other=0.0)
            m_new = tl.maximum(m_all, tl.max(m_part, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            l_all = l_all * tl.exp2(m_all - m_safe) + tl.sum(l_part * tl.exp2(m_part - m_safe[None, :]), axis=0)
            m_all = m_new
        b_lse = tl.where(l_all > 0, m_all + tl.log2(tl.where(l_all > 0, l_all, 1.0)), 0.0)

    # The last R1 compressed positions of the block before this chunk start the pooling carry.
    carry = tl.full([1], float("-inf"), dtype=tl.float32)
    for r in tl.static_range(R1):
        j = b_lo * P - R1 + r
        ok = (j >= 0) & (j < n_vis) & (b_lo < b_hi)
        b_kj = tl.load(p_kc + tl.maximum(j, 0).to(tl.int64) * stride_kn + o_d, mask=m_d & ok, other=0.0)
        s_j = tl.sum(b_q.to(tl.float32) * b_kj.to(tl.float32)[None, :], axis=1)
        if SOFTMAX:
            v_j = tl.sum(tl.where(m_g, tl.exp2(s_j * scale_log2 - b_lse), 0.0), axis=0)
        else:
            v_j = tl.sum(tl.where(o_g == 0, s_j, 0.0), axis=0)
        carry = tl.maximum(carry, tl.where(ok, v_j, float("-inf")))

    p_s = s_ptr + i_b.to(tl.int64) * stride_sb + i_h.to(tl.int64) * stride_sh
    for b0 in range(b_lo, b_hi, BN):
        o_j = b0 * P + tl.arange(0, BNC)
        b_k = tl.load(
            p_kc + o_j.to(tl.int64)[:, None] * stride_kn + o_d[None, :],
            mask=(o_j < N)[:, None] & m_d[None, :],
            other=0.0,
        )
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION)
        if SOFTMAX:
            b_p = tl.where(m_g[:, None], tl.exp2(b_s * scale_log2 - b_lse[:, None]), 0.0)
        else:
            b_p = tl.where((o_g == 0)[:, None], b_s, 0.0)
        b_p = tl.sum(b_p, axis=0)
        b_p = tl.where(o_j < n_vis, b_p, float("-inf"))
        b_blk, carry = _pool_tile(tl.reshape(b_p, [1, BNC]), carry, 1, BN, P, R1)
        o_b = b0 + tl.arange(0, BN)
        tl.store(p_s + o_b[None, :], b_blk, mask=(o_b < b_hi)[None, :])
    if FUSE_TOPK:
        # Every program counts itself in once its scores are stored — the barrier orders every thread's stores
        # before the count, whose release makes them visible to the program that acquires it after them — and the
        # one that brings the count to NCH finds the whole row written (read through L2).
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + i_bh, 1, sem="acq_rel", scope="gpu")
        if done == NCH - 1:
            tl.store(cnt_ptr + i_bh, 0)  # zero again for the next call (stream order keeps it before that call)
            o_r = tl.arange(0, 1)
            row = o_r.to(tl.int64) * 0
            p_i = idx_ptr + i_b.to(tl.int64) * stride_ib + i_h.to(tl.int64) * stride_ih
            _select_rows(
                p_s, p_i, row, row, pos + o_r * 0, o_r == 0, seqlen < DENSE_LEN, NBP, 1, S, SP, BLOCK, INIT, LOCAL,
                BUDGET, True, ARITY, BITONIC, KP, True,
            )  # fmt: skip


@triton.jit
def _searched_choice(key, k_eff, ARITY: tl.constexpr):
    """``chosen [SUB, NBP]``: the ``k_eff [SUB]`` largest of each row's ``key [SUB, NBP]`` (int32, float order;
    INT_MIN for non-candidates), ties taken lowest block first, by a threshold search."""
    # tau = the k-th largest key: the largest t with #{key >= t} >= k, by an ARITY-ary search over the rows' key
    # range: per pass, ARITY thresholds t_j = lo + floor(span · j / ARITY) (t_0 = lo, whose count is >= k), one
    # comparison per element and threshold, and one count per threshold (the counts share one cross-warp
    # reduction); the bracket becomes [t_j*, t_{j*+1} − 1] for the last t_j* still counting >= k. ARITY 2 is a
    # binary search. The bracket: tau lies in [the smallest candidate key, the largest]; k_eff == 0 gives
    # tau = INT_MAX, above every candidate.
    hi = tl.max(key, axis=1).to(tl.int64)
    lo = tl.min(tl.where(key > -2147483648, key, 2147483647), axis=1).to(tl.int64)
    lo = tl.where(k_eff > 0, lo, 2147483647)
    hi = tl.where(k_eff > 0, hi, 2147483647)
    o_a = tl.arange(0, ARITY)
    while tl.max(hi - lo, axis=0) > 0:
        active = hi > lo
        t = lo[:, None] + ((hi - lo + 1)[:, None] * o_a[None, :]) // ARITY  # [SUB, ARITY], non-decreasing
        # (an active row's keys are at most +inf's, 0x7F800000: every t fits int32)
        cnt = tl.sum((key[:, None, :] >= t.to(tl.int32)[:, :, None]).to(tl.int32), axis=2)
        # the counts fall as t rises, so the thresholds still counting >= k are a prefix: j* = its length − 1
        j_star = tl.sum((cnt >= k_eff[:, None]).to(tl.int32), axis=1) - 1
        t_lo = tl.sum(tl.where(o_a[None, :] == j_star[:, None], t, 0), axis=1)
        t_up = tl.sum(tl.where(o_a[None, :] == j_star[:, None] + 1, t, 0), axis=1)
        t_up = tl.where(j_star + 1 < ARITY, t_up, hi + 1)
        # exactly k_eff keys >= t_j*: they are the selection, whatever tau is — the row stops at tau = t_j* − 1
        # (they are then the keys > tau and no tie is taken): about half of a full search's passes on scores
        # without ties at the boundary
        exact = tl.sum(tl.where(o_a[None, :] == j_star[:, None], cnt, 0), axis=1) == k_eff
        lo = tl.where(active, tl.where(exact, t_lo - 1, t_lo), lo)
        hi = tl.where(active, tl.where(exact, t_lo - 1, t_up - 1), hi)
    tau = lo.to(tl.int32)[:, None]
    # tau > INT_MIN whenever k_eff > 0 (and INT_MAX, which no candidate's key is, when k_eff == 0)
    gt = key > tau
    eq = key == tau
    need = k_eff - tl.sum(gt.to(tl.int32), axis=1)
    chosen = gt | (eq & (tl.cumsum(eq.to(tl.int32), axis=1) <= need[:, None]))
    return chosen


@triton.jit
def _bitonic_choice(key, k_eff, NBP: tl.constexpr, KP: tl.constexpr):
    """:func:`_searched_choice` by a bitonic top-``KP`` (``tl.topk``, ``KP >= max k_eff``, a power of two) of
    64-bit keys: the score's key in the high word, ``NBP − 1 − block`` in the low one, so every key is distinct and
    ties order lowest block first. The ``k_eff``-th largest of them is the row's threshold; what reaches it is the
    choice. No data-dependent passes: its latency is the same on every row, ties or not."""
    o_c = tl.arange(0, NBP)
    wide = (key.to(tl.int64) << 32) | (NBP - 1 - o_c)[None, :].to(tl.int64)
    top = tl.topk(wide, KP)  # [SUB, KP], descending along the rows
    o_k = tl.arange(0, KP)
    tau = tl.sum(tl.where(o_k[None, :] == k_eff[:, None] - 1, top, 0), axis=1)
    # k_eff <= the candidates, so tau is a candidate's key and every non-candidate (INT_MIN in the high word) lies
    # below it; k_eff == 0 chooses nothing
    return (wide >= tau[:, None]) & (k_eff[:, None] > 0)


@triton.jit
def _select_rows(
    p_s, p_i, row_s, row_i, pos, m_row, dense, NBP: tl.constexpr, SUB: tl.constexpr, S: tl.constexpr,
    SP: tl.constexpr, BLOCK: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr, BUDGET: tl.constexpr,
    DECODE: tl.constexpr, ARITY: tl.constexpr, BITONIC: tl.constexpr, KP: tl.constexpr,
    L2_ONLY: tl.constexpr = False,
):  # fmt: skip
    """Select and store the blocks of ``SUB`` query rows: their candidate scores at ``p_s + row_s`` (``NBP`` wide),
    their lists at ``p_i + row_i`` (``S`` wide, ascending, −1 padded); ``pos`` the rows' token positions, ``m_row``
    the valid rows, ``dense`` (decode) whether the sequence attends every causal block. Returns the selection mask
    ``[SUB, NBP]``. ``L2_ONLY``: the scores are read through L2 (``.cg``), as a decode selection that fuses its top-k
    must: other programs of the same launch wrote them."""
    o_c = tl.arange(0, NBP)
    qb = pos // BLOCK
    # Non-candidates (outside the causal range, forced, never scored, -inf or NaN) get the smallest key, which
    # no count threshold reaches: one int32 per block is all the passes below keep live.
    cand = (o_c[None, :] <= qb[:, None]) & m_row[:, None]
    cand = cand & (o_c[None, :] >= INIT) & (o_c[None, :] < qb[:, None] - LOCAL)
    # Rows are NBP wide: load them whole (16-byte vectors) and keep the candidates, the rest was never written.
    if L2_ONLY:
        b_s = tl.load(
            p_s + row_s[:, None] + o_c[None, :], mask=m_row[:, None], other=float("-inf"), cache_modifier=".cg"
        )
    else:
        b_s = tl.load(p_s + row_s[:, None] + o_c[None, :], mask=m_row[:, None], other=float("-inf"))
    b_s = tl.where(b_s == 0.0, 0.0, b_s)  # -0.0 and +0.0 must share one key
    bits = b_s.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # int32 order == float order
    key = tl.where(cand & (b_s > float("-inf")), key, -2147483648)
    # forced: blocks < INIT and the local window [qb - LOCAL, qb], counted without a pass over the row
    n_forced = tl.minimum(qb + 1, INIT) + tl.maximum(qb + 1 - tl.maximum(qb - LOCAL, INIT), 0)
    n_cand = tl.sum((key > -2147483648).to(tl.int32), axis=1)
    k_eff = tl.minimum(tl.maximum(BUDGET - n_forced, 0), n_cand)
    if BITONIC:
        chosen = _bitonic_choice(key, k_eff, NBP, KP)
    else:
        chosen = _searched_choice(key, k_eff, ARITY)
    # the masks again rather than kept live through the search (registers: one int32 array is all it holds)
    causal = (o_c[None, :] <= qb[:, None]) & m_row[:, None]
    forced = causal & ((o_c[None, :] < INIT) | (o_c[None, :] >= qb[:, None] - LOCAL))
    sel = forced | chosen
    if DECODE:
        sel = tl.where(dense, causal, sel)

    slot = tl.cumsum(sel.to(tl.int32), axis=1) - 1
    n_sel = tl.sum(sel.to(tl.int32), axis=1)
    tl.store(p_i + row_i[:, None] + slot, o_c[None, :] + tl.zeros([SUB, NBP], dtype=tl.int32), mask=sel & (slot < S))
    o_sp = tl.arange(0, SP)
    pad = m_row[:, None] & (o_sp[None, :] >= n_sel[:, None]) & (o_sp[None, :] < S)
    tl.store(p_i + row_i[:, None] + o_sp[None, :], tl.full([SUB, SP], -1, dtype=tl.int32), mask=pad)
    return sel


@triton.jit
def select_fwd_kernel_topk(
    s_ptr,
    len_ptr,
    idx_ptr,
    pblk_ptr,
    pbits_ptr,
    pcnt_ptr,
    T,
    t_begin,
    stride_sb,
    stride_sh,
    stride_st,
    stride_ib,
    stride_it,
    stride_ih,
    stride_pb,
    stride_ph,
    stride_pt,
    stride_cb,
    stride_ch,
    HKV: tl.constexpr,
    BT: tl.constexpr,
    NBP: tl.constexpr,
    S: tl.constexpr,
    SP: tl.constexpr,
    U: tl.constexpr,
    UP: tl.constexpr,
    BLOCK: tl.constexpr,
    INIT: tl.constexpr,
    LOCAL: tl.constexpr,
    BUDGET: tl.constexpr,
    DENSE_LEN: tl.constexpr,
    DECODE: tl.constexpr,
    WRITE_PLAN: tl.constexpr,
    SUB: tl.constexpr,
    ARITY: tl.constexpr = 2,
    BITONIC: tl.constexpr = False,
    KP: tl.constexpr = 1,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_c = tl.arange(0, NBP)
    o_i = tl.arange(0, SUB)
    p_s = s_ptr + i_b.to(tl.int64) * stride_sb + i_h.to(tl.int64) * stride_sh
    p_i = idx_ptr + i_b.to(tl.int64) * stride_ib + i_h.to(tl.int64) * stride_ih
    union = tl.zeros([NBP], dtype=tl.int32)
    tok_bits = tl.zeros([NBP], dtype=tl.int32)
    # The tile's BT rows go SUB at a time: a [SUB, NBP] slab of scores, keys and masks stays in registers (a whole
    # 16-row tile of 2,048 blocks does not: 952 B of stack per thread at Qwen3.5's tile), the plan accumulates.
    for r0 in range(0, BT, SUB):
        o_r = r0 + o_i
        if DECODE:
            seqlen = tl.load(len_ptr + i_b).to(tl.int32)
            pos = seqlen - 1 + o_r * 0
            m_row = o_r == 0
            dense = seqlen < DENSE_LEN
            row_s = o_r.to(tl.int64) * 0
            row_i = o_r.to(tl.int64) * 0
        else:
            pos = t_begin + i_t * BT + o_r
            m_row = pos < T
            dense = False
            row_s = (pos - t_begin).to(tl.int64) * stride_st
            row_i = pos.to(tl.int64) * stride_it
        sel = _select_rows(
            p_s, p_i, row_s, row_i, pos, m_row, dense, NBP, SUB, S, SP, BLOCK, INIT, LOCAL, BUDGET, DECODE, ARITY,
            BITONIC, KP,
        )  # fmt: skip
        if WRITE_PLAN:
            union = tl.maximum(union, tl.max(sel.to(tl.int32), axis=0))
            tok_bits = tok_bits | tl.sum(sel.to(tl.int32) << o_r[:, None], axis=0)

    if WRITE_PLAN:
        i_tile = (t_begin // BT) + i_t
        u_slot = tl.cumsum(union, axis=0) - 1
        n_union = tl.sum(union, axis=0)
        p_p = i_b.to(tl.int64) * stride_pb + i_h.to(tl.int64) * stride_ph + i_tile.to(tl.int64) * stride_pt
        tl.store(pblk_ptr + p_p + u_slot, o_c, mask=(union > 0) & (u_slot < U))
        tl.store(pbits_ptr + p_p + u_slot, tok_bits, mask=(union > 0) & (u_slot < U))
        o_up = tl.arange(0, UP)
        m_pad = (o_up >= n_union) & (o_up < U)
        tl.store(pblk_ptr + p_p + o_up, tl.full([UP], -1, dtype=tl.int32), mask=m_pad)
        tl.store(pbits_ptr + p_p + o_up, tl.zeros([UP], dtype=tl.int32), mask=m_pad)
        tl.store(pcnt_ptr + i_b.to(tl.int64) * stride_cb + i_h.to(tl.int64) * stride_ch + i_tile, n_union)
