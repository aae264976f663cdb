"""Triton kernel of the gated RMS norm (launched from ``norm.gated``).

One program per ``BR`` rows of ``D`` elements (a row: one token's one head): the mean square in float32, ``x̂``
rounded to the input dtype and multiplied by the weight in it (the module's order, so the rounding matches), then
``silu(z)`` in float32 and one rounding to the output dtype.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["R"])
def gated_rms_norm_fwd_kernel(
    x_ptr,
    z_ptr,
    w_ptr,
    o_ptr,
    R,
    stride_x,
    stride_z,
    stride_o,
    eps,
    D: tl.constexpr,
    BD: tl.constexpr,
    BR: tl.constexpr,
):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    m_c = cols < D
    m = (rows < R)[:, None] & m_c[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + cols[None, :], mask=m, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)
    xn = (xf * rstd[:, None]).to(x.dtype)
    w = tl.load(w_ptr + cols, mask=m_c, other=0.0)
    y = (w[None, :] * xn).to(tl.float32)
    z = tl.load(z_ptr + r64 * stride_z + cols[None, :], mask=m, other=0.0).to(tl.float32)
    out = y * (z * tl.sigmoid(z))
    tl.store(o_ptr + r64 * stride_o + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=m)
