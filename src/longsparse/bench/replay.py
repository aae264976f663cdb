"""Decode steps that read replayed block selections: the model's own selectors run (their cost stays in the step), and
the KV cache then sees the block lists of a :class:`~longsparse.bench.locality.LocalityProcess` instead of theirs.

The substitution happens where the selections enter the cache — :meth:`KVCache.prefetch` (SparDA's forecast, one
attention layer early) and :meth:`KVCache.block_slots` (every mode) — by overwriting the selector's block-id tensor in
place, so everything after it (planner, copies, prefetch stream, block tables, attention) is the real path, and a
CUDA graph captured over the step replays the substitution too: the step's row of the bank is chosen on the device
from the batch's positions, which the graph advances in place.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from ..engine.cache import KVCache
from ..models.batch import ForwardBatch


class SelectionBank:
    """``bank [steps, layers, slots, Hkv, W]`` (int32, on the cache's device): the block lists of the decode steps
    whose tokens sit at positions ``start … start + steps − 1``, per attention layer (``layers``, in the bank's order)
    and cache slot. A step beyond the bank raises on the host (:meth:`check`), never silently repeats."""

    def __init__(self, bank: np.ndarray | torch.Tensor, layers: Sequence[int], start: int, device: torch.device | str):
        bank = torch.as_tensor(bank, dtype=torch.int32)
        if bank.dim() != 5 or bank.shape[1] != len(layers):
            raise ValueError(f"bank must be [steps, {len(layers)} layers, slots, Hkv, W], got {tuple(bank.shape)}")
        self.bank = bank.to(device)
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.start = start

    @property
    def steps(self) -> int:
        return self.bank.shape[0]

    def write(self, layer: int, batch: ForwardBatch, block_ids: torch.Tensor) -> None:
        """Overwrite ``block_ids [N, Hkv, W]`` with the bank's lists of ``layer`` at the batch's positions."""
        if layer not in self.index:
            raise ValueError(f"layer {layer} is not in the selection bank (layers {sorted(self.index)})")
        step = (batch.positions - self.start).clamp_(0, self.steps - 1)
        block_ids.copy_(self.bank[:, self.index[layer]][step, batch.slot_index])

    def check(self, positions: Sequence[int]) -> None:
        """Raise unless every position lies within the bank (call with the positions a run reached)."""
        bad = [p for p in positions if not self.start <= p < self.start + self.steps]
        if bad:
            raise ValueError(
                f"positions {bad[:4]} lie outside the selection bank's {self.start} … {self.start + self.steps - 1}"
            )


class _Replaying(KVCache):
    """Mixin over a :class:`KVCache` class: selections are overwritten from ``self.selection_bank`` on entry (a
    ``KVCache`` itself, so that a subclass mixing it in keeps the instance layout and ``__class__`` can change)."""

    def prefetch(self, layer, batch, block_ids):
        self.selection_bank.write(layer, batch, block_ids)
        self._replayed.add(layer)
        super().prefetch(layer, batch, block_ids)

    def block_slots(self, layer, batch, block_ids, block_size):
        if layer in self._replayed:
            self._replayed.discard(layer)  # announced by prefetch: already overwritten, the same tensor
        else:
            self.selection_bank.write(layer, batch, block_ids)
        return super().block_slots(layer, batch, block_ids, block_size)


@functools.cache
def _replaying_class(cls: type) -> type:
    return type(f"Replaying{cls.__name__}", (_Replaying, cls), {"__module__": __name__})


def replay_selections(cache: KVCache, bank: SelectionBank) -> KVCache:
    """Make ``cache`` read ``bank``'s selections (module docstring): its class becomes a subclass of its own that
    overwrites each selection on entry; everything else about it is unchanged. Returns ``cache``."""
    if not isinstance(cache, KVCache):
        raise ValueError(f"cache must be a KVCache, got {type(cache).__name__}")
    cache.__class__ = _replaying_class(type(cache))
    cache.selection_bank = bank
    cache._replayed = set()
    return cache
