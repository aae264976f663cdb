"""Pure-torch reference of the gated RMS norm (the module's own arithmetic)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_rms_norm_ref(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x, z [..., D]``, ``weight [D]`` -> ``w · x̂ · silu(z)`` in ``x``'s dtype, ``x̂ = x / sqrt(mean(x²) + eps)``
    over the last dim: ``x̂`` in float32 rounded to ``x``'s dtype, times the weight, times ``silu(z)`` in float32."""
    xf = x.float()
    xn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return ((weight * xn.to(x.dtype)) * F.silu(z.float())).to(x.dtype)
