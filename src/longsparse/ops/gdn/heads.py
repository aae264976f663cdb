"""A SparseGDN call over part of a layer's heads (tensor parallelism), whose selection still sees every head.

The selection is local to a pair in most of its steps, but two of them weigh the pairs against each other: the gate
visibility G_h divides a head's gate energy by the mean over all heads, and the tier split (Eqs. 12–14) normalises
the pairs' upgrade gains by their mean and gives the high and mid tiers to the best of all pairs. A call over a
share of the heads that decided on its own would choose other events than one call over all heads. With a
:class:`HeadSplit`, the calls of the ranks exchange the few per-head numbers these steps read (tail scores and chunk
decays, ``[chunks, heads]``, and the gate energy, ``[sequences, heads]``), so that every rank takes the same
decisions as a single call and runs the events of its own pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HeadSplit:
    """This call holds value heads ``first … first + count − 1`` of a layer of ``total``; calls running at the same
    time over the other heads (the other ranks) hold the rest, in order. ``gather(x, dim)``: every call's ``x``
    concatenated along ``dim`` in head order (an all-gather over the ranks; every call must make the same gathers in
    the same order)."""

    first: int
    count: int
    total: int
    gather: Callable[[torch.Tensor, int], torch.Tensor]

    def __post_init__(self):
        if not (0 <= self.first and 0 < self.count and self.first + self.count <= self.total):
            raise ValueError(f"heads {self.first} … {self.first + self.count - 1} do not lie in 0 … {self.total - 1}")

    def check(self, heads: int, group: int) -> None:
        """ValueError unless the call's ``heads`` value heads are :attr:`count` whole pairs of ``group`` heads."""
        if heads != self.count:
            raise ValueError(f"head_split holds {self.count} value heads but the call has {heads}")
        if self.first % group or self.count % group:
            raise ValueError(
                f"head_split {self.first} … {self.first + self.count - 1} splits a pair of {group} value heads"
            )

    def own_pairs(self, x: torch.Tensor, group: int) -> torch.Tensor:
        """This call's pairs of ``x [N, P, …]`` (every pair of the layer)."""
        return x[:, self.first // group : (self.first + self.count) // group]
