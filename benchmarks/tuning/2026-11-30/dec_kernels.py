"""Decode split-kernel variants: preloaded run lists (PRE), swapped MMA operands (SWAP), NB blocks per step."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["S", "NSPLIT", "EPS"])
def split_var(
    q_ptr, ks_ptr, vs_ptr, tbl_ptr, ids_ptr, len_ptr, acc_ptr, m_ptr, l_ptr, cnt_ptr, o_ptr, stride_ob, stride_oh,
    stride_qb, stride_qh, stride_ks, stride_kr, stride_vs, stride_vr, stride_tb, stride_th, stride_ib, stride_ih,
    S, NSPLIT, EPS, scale_log2,
    HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
    EPSP: tl.constexpr, NB: tl.constexpr, PRE: tl.constexpr, SWAP: tl.constexpr,
    FUSE: tl.constexpr = False, NSP: tl.constexpr = 16, CH: tl.constexpr = 4,
):
    i_bh, i_s = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, D)
    m_g = o_g < G
    head = (i_h * G + o_g).to(tl.int64)
    b_q = tl.load(q_ptr + i_b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + o_d[None, :],
                  mask=m_g[:, None], other=0.0)
    seqlen = tl.load(len_ptr + i_b)
    p_tbl = tbl_ptr + i_b.to(tl.int64) * stride_tb + i_h.to(tl.int64) * stride_th
    p_ids = ids_ptr + i_b.to(tl.int64) * stride_ib + i_h.to(tl.int64) * stride_ih
    KN: tl.constexpr = NB * BLOCK
    o_n = tl.arange(0, KN)
    o_sub = o_n // BLOCK
    o_r = o_n % BLOCK
    e_lo = i_s * EPS
    e_hi = tl.minimum(e_lo + EPS, S)
    if PRE:
        o_e = tl.arange(0, EPSP)
        m_e = (e_lo + o_e) < e_hi
        v_slot = tl.load(p_tbl + e_lo + o_e, mask=m_e, other=-1)
        v_blk = tl.load(p_ids + e_lo + o_e, mask=m_e, other=-1)
    if SWAP:
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([D, GP], dtype=tl.float32)
    else:
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, D], dtype=tl.float32)
    for e0 in range(e_lo, e_lo + EPS, NB):
        e = e0 + o_sub
        if PRE:
            j = (e - e_lo)
            slot = tl.sum(tl.where(j[:, None] == o_e[None, :], v_slot[None, :], 0), axis=1)
            blk = tl.sum(tl.where(j[:, None] == o_e[None, :], v_blk[None, :], 0), axis=1)
            inl = e < e_hi
            slot = tl.where(inl, slot, -1)
            blk = tl.where(inl, blk, -1)
        else:
            inl = e < e_hi
            slot = tl.load(p_tbl + e, mask=inl, other=-1)
            blk = tl.load(p_ids + e, mask=inl, other=-1)
        used = (slot >= 0) & (blk >= 0)
        m_key = used & (blk * BLOCK + o_r < seqlen)
        row = tl.maximum(slot, 0).to(tl.int64)
        b_k = tl.load(ks_ptr + row[:, None] * stride_ks + o_r[:, None] * stride_kr + o_d[None, :],
                      mask=m_key[:, None], other=0.0)
        b_v = tl.load(vs_ptr + row[:, None] * stride_vs + o_r[:, None] * stride_vr + o_d[None, :],
                      mask=m_key[:, None], other=0.0)
        if SWAP:
            b_s = tl.dot(b_k, tl.trans(b_q)) * scale_log2  # [KN, GP]
            b_s = tl.where(m_key[:, None], b_s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            b_p = tl.exp2(b_s - m_safe[None, :])
            l_i = l_i * alpha + tl.sum(b_p, axis=0)
            acc = acc * alpha[None, :] + tl.dot(tl.trans(b_v), b_p.to(b_v.dtype))
            m_i = m_new
        else:
            b_s = tl.dot(b_q, tl.trans(b_k)) * scale_log2
            b_s = tl.where(m_key[None, :], b_s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            b_p = tl.exp2(b_s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(b_p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
            m_i = m_new
    o_part = (i_bh.to(tl.int64) * NSPLIT + i_s) * GP + o_g
    tl.store(m_ptr + o_part, m_i)
    tl.store(l_ptr + o_part, l_i)
    if SWAP:
        tl.store(acc_ptr + o_part[None, :] * D + o_d[:, None], acc)
    else:
        tl.store(acc_ptr + o_part[:, None] * D + o_d[None, :], acc)
    if FUSE:
        tl.debug_barrier()
        old = tl.atomic_add(cnt_ptr + i_bh, 1, sem="acq_rel", scope="gpu")
        if old == NSPLIT - 1:
            o_s = tl.arange(0, NSP)
            m_s = o_s < NSPLIT
            rows = (i_bh.to(tl.int64) * NSPLIT + o_s)[:, None] * GP + o_g[None, :]
            b_m = tl.load(m_ptr + rows, mask=m_s[:, None], other=float("-inf"), cache_modifier=".cg")
            b_l = tl.load(l_ptr + rows, mask=m_s[:, None], other=0.0, cache_modifier=".cg")
            m_all = tl.max(b_m, axis=0)
            m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
            l_all = tl.sum(tl.exp2(b_m - m_safe[None, :]) * b_l, axis=0)
            o_c = tl.arange(0, CH)
            out = tl.zeros([GP, D], dtype=tl.float32)
            for c in tl.static_range(NSP // CH):
                s_c = c * CH + o_c
                m_c = s_c < NSPLIT
                r_c = (i_bh.to(tl.int64) * NSPLIT + s_c)[:, None] * GP + o_g[None, :]
                w_c = tl.exp2(tl.load(m_ptr + r_c, mask=m_c[:, None], other=float("-inf"), cache_modifier=".cg")
                              - m_safe[None, :])
                a_c = tl.load(acc_ptr + r_c[:, :, None] * D + o_d[None, None, :], mask=m_c[:, None, None], other=0.0,
                              cache_modifier=".cg")
                out += tl.sum(w_c[:, :, None] * a_c, axis=0)
            b_o = tl.where(l_all[:, None] > 0, out / tl.where(l_all > 0, l_all, 1.0)[:, None], 0.0)
            p_o = o_ptr + i_b.to(tl.int64) * stride_ob + head[:, None] * stride_oh + o_d[None, :]
            tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=m_g[:, None])
            tl.atomic_xchg(cnt_ptr + i_bh, 0)
