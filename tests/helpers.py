"""Numerical helpers shared by the tests."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``‖a − b‖ / ‖b‖`` in float64; NaN anywhere gives inf."""
    a, b = a.double(), b.double()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()
