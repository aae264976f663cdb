"""Triton kernels of block-sparse decode attention over a block-slot cache (launched from ``sparse_attn.decode``).

Split-KV ("flash decoding"): the block list of each (sequence, KV head) is cut into ``NSPLIT`` runs of ``EPS``
entries; one program per run attends its blocks in place in the slot cache — the G query heads of the group as
the MMA's rows (padded to 16) — and writes an unnormalised partial output with its row max and sum; a second
kernel merges the runs, one program per output row. With ``NSPLIT == 1`` the first kernel writes the output itself.

With ``PRELOAD`` (runs of at most ``decode.PRELOAD_MAX_RUN`` blocks, head dims up to ``decode.PRELOAD_MAX_DIM``;
``EPSP`` is ``EPS`` rounded up to a power of two) a program loads its run's slots and block ids as one vector before
the loop, so each K/V address depends on registers only and the software pipeline can fetch the next blocks while
the current one is computed; loaded inside the loop, every K/V load waits for its own table load first.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["S", "NSPLIT", "EPS"])  # they change as sequences grow: no recompiles
def decode_fwd_kernel_split(
    q_ptr,
    ks_ptr,
    vs_ptr,
    tbl_ptr,
    ids_ptr,
    len_ptr,
    o_ptr,
    acc_ptr,
    m_ptr,
    l_ptr,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kr,
    stride_vs,
    stride_vr,
    stride_tb,
    stride_th,
    stride_ib,
    stride_ih,
    stride_ob,
    stride_oh,
    S,
    NSPLIT,
    EPS,
    scale_log2,
    HKV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BLOCK: tl.constexpr,
    FINAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PRELOAD: tl.constexpr,
    EPSP: tl.constexpr,
):
    i_bh, i_s = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_g = tl.arange(0, GP)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_g = o_g < G
    head = (i_h * G + o_g).to(tl.int64)
    b_q = tl.load(
        q_ptr + i_b.to(tl.int64) * stride_qb + head[:, None] * stride_qh + o_d[None, :],
        mask=m_g[:, None] & m_d[None, :],
        other=0.0,
    )
    seqlen = tl.load(len_ptr + i_b)
    p_tbl = tbl_ptr + i_b.to(tl.int64) * stride_tb + i_h.to(tl.int64) * stride_th
    p_ids = ids_ptr + i_b.to(tl.int64) * stride_ib + i_h.to(tl.int64) * stride_ih
    o_n = tl.arange(0, BLOCK)

    m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, BD], dtype=tl.float32)
    e_lo = i_s * EPS
    if PRELOAD:
        o_e = tl.arange(0, EPSP)
        m_e = (o_e < EPS) & (e_lo + o_e < S)
        run_slot = tl.load(p_tbl + e_lo + o_e, mask=m_e, other=-1)
        run_blk = tl.load(p_ids + e_lo + o_e, mask=m_e, other=-1)
    for e in range(e_lo, e_lo + EPS):
        if PRELOAD:
            pick = o_e == e - e_lo
            slot = tl.sum(tl.where(pick, run_slot, 0), axis=0)
            blk = tl.sum(tl.where(pick, run_blk, 0), axis=0)
        else:
            in_list = e < S
            slot = tl.load(p_tbl + e, mask=in_list, other=-1)
            blk = tl.load(p_ids + e, mask=in_list, other=-1)
        used = (slot >= 0) & (blk >= 0)
        o_key = blk * BLOCK + o_n
        m_key = used & (o_key < seqlen)
        row = tl.maximum(slot, 0).to(tl.int64)
        m_kd = m_key[:, None] & m_d[None, :]
        b_k = tl.load(ks_ptr + row * stride_ks + o_n[:, None] * stride_kr + o_d[None, :], mask=m_kd, other=0.0)
        b_v = tl.load(vs_ptr + row * stride_vs + o_n[:, None] * stride_vr + o_d[None, :], mask=m_kd, other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION) * scale_log2
        b_s = tl.where(m_key[None, :], b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        b_p = tl.exp2(b_s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(b_p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=DOT_PRECISION)
        m_i = m_new

    if FINAL:
        b_o = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
        p_o = o_ptr + i_b.to(tl.int64) * stride_ob + head[:, None] * stride_oh + o_d[None, :]
        tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=m_g[:, None] & m_d[None, :])
    else:
        o_part = (i_bh.to(tl.int64) * NSPLIT + i_s) * GP + o_g
        tl.store(m_ptr + o_part, m_i)
        tl.store(l_ptr + o_part, l_i)
        tl.store(acc_ptr + o_part[:, None] * BD + o_d[None, :], acc)


@triton.jit(do_not_specialize=["NSPLIT"])
def decode_fwd_kernel_merge(
    acc_ptr,
    m_ptr,
    l_ptr,
    o_ptr,
    stride_ob,
    stride_oh,
    NSPLIT,
    HKV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    NSP: tl.constexpr,
):
    # One program per (sequence, KV head, query head): all runs' partials of one output row at once.
    i_bh, i_g = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_s = tl.arange(0, NSP)
    o_d = tl.arange(0, BD)
    m_s = o_s < NSPLIT
    row = (i_bh.to(tl.int64) * NSPLIT + o_s) * GP + i_g
    b_m = tl.load(m_ptr + row, mask=m_s, other=float("-inf"))
    b_l = tl.load(l_ptr + row, mask=m_s, other=0.0)
    b_a = tl.load(acc_ptr + row[:, None] * BD + o_d[None, :], mask=m_s[:, None], other=0.0)
    m_all = tl.max(b_m, axis=0)
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(b_m - m_safe)
    l_all = tl.sum(w * b_l, axis=0)
    acc = tl.sum(w[:, None] * b_a, axis=0)
    b_o = tl.where(l_all > 0, acc / tl.where(l_all > 0, l_all, 1.0), 0.0)
    p_o = o_ptr + i_b.to(tl.int64) * stride_ob + (i_h * G + i_g).to(tl.int64) * stride_oh + o_d
    tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=o_d < D)
