"""Triton kernel of the RMS norms (launched from ``norm.rms``).

One program per ``BR`` rows of ``D`` elements: the mean square in float32, then the module's own arithmetic and
rounding steps —

* ``ZERO_CENTERED`` (Qwen3.5's layer and q/k norms): ``x̂ · (1 + w)`` in float32, rounded once;
* otherwise (Llama's norms, and the GDN output norm): ``x̂`` rounded to the input dtype, times the weight in that
  dtype; with ``GATED``, times ``silu(z)`` in float32 and rounded once more;
* ``L2`` (the GDN q/k normalisation): ``x / sqrt(sum(x²) + eps)`` in float32, no weight, rounded once.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["R"])
def rms_norm_fwd_kernel(
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
    GATED: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    L2: tl.constexpr = False,
):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    m_c = cols < D
    m = (rows < R)[:, None] & m_c[None, :]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + r64 * stride_x + cols[None, :], mask=m, other=0.0)
    xf = x.to(tl.float32)
    if L2:
        out = xf * tl.rsqrt(tl.sum(xf * xf, axis=1) + eps)[:, None]
    else:
        xn = xf * tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]
        w = tl.load(w_ptr + cols, mask=m_c, other=0.0)
        if ZERO_CENTERED:
            out = xn * (1.0 + w.to(tl.float32))[None, :]
        else:
            out = w[None, :] * xn.to(x.dtype)
            if GATED:
                z = tl.load(z_ptr + r64 * stride_z + cols[None, :], mask=m, other=0.0).to(tl.float32)
                out = out.to(tl.float32) * (z * tl.sigmoid(z))
    tl.store(o_ptr + r64 * stride_o + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=m)
