"""Triton kernel of the short causal convolution (launched from ``conv.short_conv``).

One program per tile of ``BT`` packed tokens and ``BC`` channels: for each of the ``W`` taps it loads the tile's
inputs ``W − 1 − j`` tokens back — from the activations when that token belongs to the same sequence, from the
sequence's conv state when it lies before the sequence's first token — and accumulates in float32; SiLU is applied
before the store. Every input row is read ``W`` times from L2/L1 but once from DRAM, so the kernel is one pass over
``x`` and ``y``.
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
    for j in tl.static_range(W):
        src = o_t - (W - 1) + j  # the input this tap reads
        inside = m_t & (src >= start)
        b_x = tl.load(
            x_ptr + src.to(tl.int64)[:, None] * stride_xt + o_c[None, :],
            mask=inside[:, None] & m_c[None, :],
            other=0.0,
        ).to(tl.float32)
        if HAS_STATE:  # before the sequence's first token: position src − start + W − 1 of its state
            before = m_t & (src < start)
            slot = src - start + (W - 1)
            b_s = tl.load(
                s_ptr + seq[:, None] * stride_sn + o_c[None, :] * stride_sc + slot[:, None],
                mask=before[:, None] & m_c[None, :],
                other=0.0,
            ).to(tl.float32)
            b_x += b_s
        b_w = tl.load(w_ptr + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
        acc += b_x * b_w[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(
        y_ptr + o_t.to(tl.int64)[:, None] * stride_yt + o_c[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=m_t[:, None] & m_c[None, :],
    )
