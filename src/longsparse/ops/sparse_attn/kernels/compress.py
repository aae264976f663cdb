"""Triton kernels of the compressed keys (launched from ``sparse_attn.compress``)."""

import triton
import triton.language as tl


@triton.jit
def compress_fwd_kernel_prefill(
    k_ptr,
    o_ptr,
    N,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_ob,
    stride_on,
    stride_oh,
    H: tl.constexpr,
    D: tl.constexpr,
    KS: tl.constexpr,
    ST: tl.constexpr,
    BJ: tl.constexpr,
    BD: tl.constexpr,
):
    i_j, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_j = i_j * BJ + tl.arange(0, BJ)
    o_d = tl.arange(0, BD)
    m_j = o_j < N
    m = m_j[:, None] & (o_d < D)[None, :]
    p_k = k_ptr + i_b.to(tl.int64) * stride_kb + i_h.to(tl.int64) * stride_kh
    row = o_j.to(tl.int64) * ST * stride_kt
    acc = tl.zeros([BJ, BD], dtype=tl.float32)
    for t in range(KS):
        acc += tl.load(p_k + row[:, None] + t * stride_kt + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    acc = acc / KS
    p_o = o_ptr + i_b.to(tl.int64) * stride_ob + i_h.to(tl.int64) * stride_oh
    tl.store(p_o + o_j.to(tl.int64)[:, None] * stride_on + o_d[None, :], acc.to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def compress_fwd_kernel_decode(
    knew_ptr,
    ring_ptr,
    o_ptr,
    len_ptr,
    NCAP,
    stride_nb,
    stride_nh,
    stride_rb,
    stride_rt,
    stride_rh,
    stride_ob,
    stride_on,
    stride_oh,
    H: tl.constexpr,
    D: tl.constexpr,
    KS: tl.constexpr,
    ST: tl.constexpr,
    BD: tl.constexpr,
):
    i_bh = tl.program_id(0)
    i_b, i_h = i_bh // H, i_bh % H
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    pos = tl.load(len_ptr + i_b).to(tl.int64)
    b_new = tl.load(knew_ptr + i_b.to(tl.int64) * stride_nb + i_h.to(tl.int64) * stride_nh + o_d, mask=m_d)
    p_ring = ring_ptr + i_b.to(tl.int64) * stride_rb + i_h.to(tl.int64) * stride_rh
    first = pos + 1 - KS
    j = first // ST
    if (first >= 0) & (first % ST == 0) & (j < NCAP):
        acc = tl.zeros([BD], dtype=tl.float32)
        # Position order, the new key (not yet in the ring) last: the prefill kernel's summation order.
        for t in range(KS - 1):
            acc += tl.load(p_ring + ((first + t) % KS) * stride_rt + o_d, mask=m_d, other=0.0).to(tl.float32)
        acc += b_new.to(tl.float32)
        acc = acc / KS
        p_o = o_ptr + i_b.to(tl.int64) * stride_ob + j * stride_on + i_h.to(tl.int64) * stride_oh
        tl.store(p_o + o_d, acc.to(o_ptr.dtype.element_ty), mask=m_d)
    tl.store(p_ring + (pos % KS) * stride_rt + o_d, b_new.to(ring_ptr.dtype.element_ty), mask=m_d)
