"""Numerical helpers and small shared settings of the tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from longsparse.ops.sparse_attn import SparseAttentionConfig


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


SMALL_BLOCK_SPARSE = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=6, kernel_size=16,
                                           kernel_stride=8, dense_len=64)  # fmt: skip
"""Block-sparse geometry of the tiny-model engine and cache tests: prompts past 64 tokens take the sparse path and span
several 16-token blocks."""
EVERY_BLOCK_SPARSE = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=64, kernel_size=16,
                                           kernel_stride=8, dense_len=0)  # fmt: skip
"""The same with a budget above every block of a tiny prompt: block-sparse attention equals dense attention."""
