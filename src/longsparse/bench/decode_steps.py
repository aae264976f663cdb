"""Greedy decode steps of a fixed batch for `longsparse bench decode`: eager, or captured once as a CUDA graph.

Eager decode issues ~80 kernels per attention layer from Python, so at MiniCPM's 32 layers a step costs the host
several milliseconds — enough to hide the GPU work (and the copy/compute overlap that SparDA is about) behind launch
overhead. A captured step replays the whole forward pass, the prefetch stream's copies included, with one launch.

Both steppers keep the tokens and positions on the device (no step waits for the host). The selectors' launches are
sized for the cache capacity (``DecodeRows.max_seqlen``), so the eager steps before a capture compile exactly the
kernels the graph records; dense attention reads the cache's full capacity under a key mask. A captured step ends
by writing its argmax into its own token input and advancing the positions, so replays run back to back; after each
replay the host does what the captured Python cannot: the block cache's lengths and the write-back of filled blocks
(:meth:`BlockKVCache.finish_step`).
"""

from __future__ import annotations

import torch

from ..cache import BlockKVCache, DecodeRows
from ..cache.streams import COMPUTE
from ..engine.block_attention import DECODE_ROWS
from ..models.batch import ForwardBatch


def _batch(rows: DecodeRows, cache, capacity: int, keys: torch.Tensor | None) -> ForwardBatch:
    """``keys``: ``arange(capacity)`` for dense attention (its mask, over the whole capacity), else None."""
    n = rows.num_seqs
    device = rows.position_index.device
    mask = None if keys is None else (keys <= rows.position_index[:, None])[:, None, None, :]
    batch = ForwardBatch(
        is_decode=True, positions=rows.position_index, cu_seqlens=torch.arange(n + 1, device=device),
        offsets=list(range(n + 1)), prefix_lens=[capacity - 1] * n if keys is not None else list(rows.positions),
        slots=list(rows.slots), slot_index=rows.slot_index, token_slots=rows.slot_index, kv_cache=cache,
        decode_mask=mask,
    )  # fmt: skip
    batch.scratch[DECODE_ROWS] = rows
    return batch


class EagerStepper:
    """One eager greedy step per :meth:`step` for sequences in slots ``0 .. N − 1`` at ``lengths`` tokens."""

    def __init__(self, model, cache, ids: torch.Tensor, lengths: list[int], capacity: int, dense: bool):
        self.model, self.cache, self.capacity = model, cache, capacity
        self.ids, self.lengths = ids, list(lengths)
        self.keys = torch.arange(capacity, device=ids.device) if dense else None

    def step(self) -> torch.Tensor:
        rows = DecodeRows.build(list(range(len(self.lengths))), self.lengths, self.ids.device, self.capacity)
        logits = self.model.compute_logits(self.model(self.ids, _batch(rows, self.cache, self.capacity, self.keys)))
        self.ids = logits.argmax(-1)
        self.lengths = [n + 1 for n in self.lengths]
        return logits


class GraphStepper:
    """The same step captured as a CUDA graph (continuing from ``ids`` / ``lengths``); :meth:`step` replays it.

    ``capture=False`` runs the captured function itself at every step instead (static buffers, in-place advances,
    host bookkeeping after the step — everything but the graph): the CPU tests check this path against
    :class:`EagerStepper`.
    """

    def __init__(
        self, model, cache, ids: torch.Tensor, lengths: list[int], capacity: int, dense: bool, capture: bool = True
    ):
        device = ids.device
        self.model, self.cache, self.lengths = model, cache, list(lengths)
        self.ids = ids.clone()
        self.rows = DecodeRows.build(list(range(len(lengths))), list(lengths), device, capacity)
        self.keys = torch.arange(capacity, device=device) if dense else None
        self.batch = _batch(self.rows, cache, capacity, self.keys)
        self.block = isinstance(cache, BlockKVCache)
        self.graph = None
        if capture:
            if self.block:
                cache.streams.forget_events()
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    self._forward()
            finally:
                if self.block:
                    cache.streams.forget_events()
            self.graph = graph

    def _forward(self) -> None:
        """One step on the static buffers, ending with the next step's token and positions in place."""
        if self.block:
            self.cache.host_bookkeeping = False
        try:
            self.logits = self.model.compute_logits(self.model(self.ids, self.batch))
            self.ids.copy_(self.logits.argmax(-1))
            self.rows.position_index.add_(1)
            self.rows.seqlens.add_(1)
            if self.keys is not None:
                self.batch.decode_mask.copy_((self.keys <= self.rows.position_index[:, None])[:, None, None, :])
        finally:
            if self.block:
                self.cache.host_bookkeeping = True

    def step(self) -> torch.Tensor:
        if self.block:
            self.cache.streams.wait(COMPUTE, "written")  # the previous write-back read ring slots
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()
        if self.block:
            self.cache.finish_step(self.rows.slots, self.lengths)
        self.lengths = [n + 1 for n in self.lengths]
        return self.logits
