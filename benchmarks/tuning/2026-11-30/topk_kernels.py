"""Decode top-k variant: a WAYS-ary search (WAYS - 1 thresholds counted per pass, one block reduction for all of them)
instead of the binary search; same selection as ``select_fwd_kernel_topk`` with ``DECODE=True``."""
import triton
import triton.language as tl


@triton.jit
def topk_decode_ways(
    s_ptr, len_ptr, idx_ptr, stride_sb, stride_sh, stride_ib, stride_ih,
    HKV: tl.constexpr, NBP: tl.constexpr, S: tl.constexpr, SP: tl.constexpr, BLOCK: tl.constexpr,
    INIT: tl.constexpr, LOCAL: tl.constexpr, BUDGET: tl.constexpr, DENSE_LEN: tl.constexpr, WAYS: tl.constexpr,
):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_c = tl.arange(0, NBP)
    p_s = s_ptr + i_b.to(tl.int64) * stride_sb + i_h.to(tl.int64) * stride_sh
    p_i = idx_ptr + i_b.to(tl.int64) * stride_ib + i_h.to(tl.int64) * stride_ih
    seqlen = tl.load(len_ptr + i_b).to(tl.int32)
    qb = (seqlen - 1) // BLOCK
    dense = seqlen < DENSE_LEN
    cand = (o_c >= INIT) & (o_c < qb - LOCAL)
    b_s = tl.load(p_s + o_c)
    b_s = tl.where(b_s == 0.0, 0.0, b_s)
    bits = b_s.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    key = tl.where(cand & (b_s > float("-inf")), key, -2147483648)
    n_forced = tl.minimum(qb + 1, INIT) + tl.maximum(qb + 1 - tl.maximum(qb - LOCAL, INIT), 0)
    n_cand = tl.sum((key > -2147483648).to(tl.int32), axis=0)
    k_eff = tl.minimum(tl.maximum(BUDGET - n_forced, 0), n_cand)
    hi = tl.max(key, axis=0).to(tl.int64)
    lo = tl.min(tl.where(key > -2147483648, key, 2147483647), axis=0).to(tl.int64)
    lo = tl.where(k_eff > 0, lo, 2147483647)
    hi = tl.where(k_eff > 0, hi, 2147483647)
    o_w = tl.arange(0, WAYS)
    while hi > lo:
        # thresholds lo = m_0 < m_1 <= ... <= m_{W-1} <= hi; #{key >= lo} >= k holds throughout
        mids = lo + (o_w.to(tl.int64) * (hi - lo) + WAYS - 1) // WAYS
        cnt = tl.sum((key[None, :] >= mids.to(tl.int32)[:, None]).to(tl.int32), axis=1)
        j_ok = tl.max(tl.where(cnt >= k_eff, o_w, 0), axis=0)
        j_exact = tl.max(tl.where((cnt == k_eff) & (o_w > 0), o_w, 0), axis=0)
        m_ok = tl.sum(tl.where(o_w == j_ok, mids, 0), axis=0)
        m_next = tl.sum(tl.where(o_w == j_ok + 1, mids, 0), axis=0)
        m_exact = tl.sum(tl.where(o_w == j_exact, mids, 0), axis=0)
        new_lo = tl.where(j_exact > 0, m_exact - 1, m_ok)
        new_hi = tl.where(j_exact > 0, m_exact - 1, tl.where(j_ok == WAYS - 1, hi, m_next - 1))
        lo = new_lo
        hi = new_hi
    tau = lo.to(tl.int32)
    gt = key > tau
    eq = key == tau
    need = k_eff - tl.sum(gt.to(tl.int32), axis=0)
    chosen = gt | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
    causal = o_c <= qb
    forced = causal & ((o_c < INIT) | (o_c >= qb - LOCAL))
    sel = forced | chosen
    sel = tl.where(dense, causal, sel)
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    n_sel = tl.sum(sel.to(tl.int32), axis=0)
    tl.store(p_i + slot, o_c, mask=sel & (slot < S))
    o_sp = tl.arange(0, SP)
    tl.store(p_i + o_sp, tl.full([SP], -1, dtype=tl.int32), mask=(o_sp >= n_sel) & (o_sp < S))
