"""Triton kernel of block-sparse prefill attention (launched from ``sparse_attn.prefill``).

One program per tile of ``BT`` consecutive query tokens and one KV head. Its M dimension is the tile's ``BT·G``
(token, head) rows, ``G`` padded to a power of two, so the G query heads of a GQA group share every K/V block load
(G = 16 for MiniCPM4: with ``BT = 4`` one 64-row MMA). The program walks the tile's union plan — the blocks any of
its tokens selected — and masks each row to the blocks its own token selected (``token_bits``) and to causality, so
every row gets exactly its per-token attention: flash-style online softmax (base 2, float32 statistics and
accumulator, P cast to the value dtype for the second MMA).
"""

import triton
import triton.language as tl


@triton.jit
def prefill_fwd_kernel_attn(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    pblk_ptr,
    pbits_ptr,
    pcnt_ptr,
    T,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_pb,
    stride_ph,
    stride_pt,
    stride_cb,
    stride_ch,
    scale_log2,
    HKV: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BT: tl.constexpr,
    BLOCK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BM: tl.constexpr,
):
    # Rows are (token, head) pairs, BM = BT·GP with GP = next_pow2(G) per token; the padding rows are masked out.
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HKV, i_bh % HKV
    o_m = tl.arange(0, BM)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    row_tok = o_m // GP
    tok = i_t * BT + row_tok
    m_row = (tok < T) & (o_m % GP < G)
    head = (i_h * G + o_m % GP).to(tl.int64)
    p_q = q_ptr + i_b.to(tl.int64) * stride_qb + tok.to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    b_q = tl.load(p_q + o_d[None, :], mask=m_row[:, None] & m_d[None, :], other=0.0)

    p_k = k_ptr + i_b.to(tl.int64) * stride_kb + i_h.to(tl.int64) * stride_kh
    p_v = v_ptr + i_b.to(tl.int64) * stride_vb + i_h.to(tl.int64) * stride_vh
    p_plan = i_b.to(tl.int64) * stride_pb + i_h.to(tl.int64) * stride_ph + i_t.to(tl.int64) * stride_pt
    n_union = tl.load(pcnt_ptr + i_b.to(tl.int64) * stride_cb + i_h.to(tl.int64) * stride_ch + i_t)
    o_n = tl.arange(0, BLOCK)

    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    for u in range(0, n_union):
        blk = tl.load(pblk_ptr + p_plan + u)
        bits = tl.load(pbits_ptr + p_plan + u)
        o_key = blk * BLOCK + o_n
        m_key = o_key < T
        row_k = o_key.to(tl.int64)[:, None]
        b_k = tl.load(p_k + row_k * stride_kt + o_d[None, :], mask=m_key[:, None] & m_d[None, :], other=0.0)
        b_v = tl.load(p_v + row_k * stride_vt + o_d[None, :], mask=m_key[:, None] & m_d[None, :], other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION) * scale_log2
        m_sel = ((bits >> row_tok) & 1) != 0
        m_s = m_sel[:, None] & (o_key[None, :] <= tok[:, None]) & m_key[None, :]
        b_s = tl.where(m_s, b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        b_p = tl.exp2(b_s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(b_p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=DOT_PRECISION)
        m_i = m_new
    b_o = tl.where(l_i[:, None] > 0, acc / tl.where(l_i > 0, l_i, 1.0)[:, None], 0.0)
    p_o = o_ptr + i_b.to(tl.int64) * stride_ob + tok.to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(p_o + o_d[None, :], b_o.to(o_ptr.dtype.element_ty), mask=m_row[:, None] & m_d[None, :])
