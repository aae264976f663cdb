"""Numerical helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``‖a − b‖ / ‖b‖`` in float64; NaN anywhere gives inf."""
    a, b = a.double(), b.double()
    if torch.isnan(a).any() or torch.isnan(b).any():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside the block (restored after). Tiny models run op by op: on a CPU shared
    with other busy processes, a second thread makes each small op wait for a core (tens of times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
