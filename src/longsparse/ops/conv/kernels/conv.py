"""Triton kernel of the short causal convolution (launched from ``conv.short_conv``).

One program per tile of ``BT`` packed tokens and ``BC`` channels: for each of the ``W`` taps it loads the tile's
inputs ``W − 1 − j`` tokens back (zero before the sequence's first token) and accumulates in float32; only a tile
within ``W − 1`` tokens of a sequence start then adds the taps that reach into that sequence's conv state (a gather,
under a branch so that the common tile stays a plain strided load). SiLU is applied before the store. Every input row
is read ``W`` times from L2/L1 but once from DRAM, so the kernel is one pass over ``x`` and ``y``.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def conv_fwd_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    tok_start_ptr,
    tok_seq_ptr,
    T,
    C,
    stride_xt,
    stride_yt,
    stride_sn,
    stride_sc,
    W: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    HAS_STATE: tl.constexpr,
    SILU: tl.constexpr,
):
    i_t, i_c = tl.program_id(0), tl.program_id(1)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m_t = o_t < T
    m_c = o_c < C
    start = tl.load(tok_start_ptr + o_t, mask=m_t, other=0)
    seq = tl.load(tok_seq_ptr + o_t, mask=m_t, other=0).to(tl.int64)
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    p_x = x_ptr + o_t.to(tl.int64)[:, None] * stride_xt + o_c[None, :]
    for j in tl.static_range(W):
        back = W - 1 - j  # this tap reads the input `back` tokens before the output's
        b_x = tl.load(p_x - back * stride_xt, mask=(m_t & (o_t - back >= start))[:, None] & m_c[None, :], other=0.0)
        b_w = tl.load(w_ptr + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
        acc += b_x.to(tl.float32) * b_w[None, :]
    if HAS_STATE:
        # Taps before a sequence's first token read its conv state (position src − start + W − 1 of it). Only tiles
        # within W − 1 tokens of a sequence start have any: the gather runs for those tiles alone.
        if tl.min(tl.where(m_t, o_t - start, W)) < W - 1:
            for j in tl.static_range(W - 1):
                src = o_t - (W - 1) + j
                before = m_t & (src < start)
                b_s = tl.load(
                    s_ptr + seq[:, None] * stride_sn + o_c[None, :] * stride_sc + (src - start + W - 1)[:, None],
                    mask=before[:, None] & m_c[None, :],
                    other=0.0,
                ).to(tl.float32)
                b_w = tl.load(w_ptr + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
                acc += b_s * b_w[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(
        y_ptr + o_t.to(tl.int64)[:, None] * stride_yt + o_c[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=m_t[:, None] & m_c[None, :],
    )
