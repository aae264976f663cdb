"""Pure-torch references of the RMS norms (the modules' own arithmetic)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _normalised(x: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False) -> torch.Tensor:
    """``x [..., D]``, ``weight [D]``: ``x̂ · (1 + w)`` in float32 cast to ``x``'s dtype when ``zero_centered``
    (Qwen3.5), else ``w · x̂`` with ``x̂`` cast to ``x``'s dtype first (Llama; the result takes the promoted dtype of
    the two). ``x̂ = x / sqrt(mean(x²) + eps)`` over the last dim, in float32."""
    xn = _normalised(x, eps)
    if zero_centered:
        return (xn * (1.0 + weight.float())).to(x.dtype)
    return weight * xn.to(x.dtype)


def gated_rms_norm_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x, z [..., D]``, ``weight [D]`` -> ``w · x̂ · silu(z)`` in ``x``'s dtype: ``x̂`` rounded to ``x``'s dtype,
    times the weight, times ``silu(z)`` in float32 (Qwen3.5's ``RMSNormGated``)."""
    return ((weight * _normalised(x, eps).to(x.dtype)) * F.silu(z.float())).to(x.dtype)


def l2_norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x²) + eps)`` over the last dim of ``x [..., D]``, in float32, cast to ``x``'s dtype (the GDN
    layers' q/k normalisation, FLA's ``use_qk_l2norm_in_kernel``)."""
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)
