"""Decode steps of a fixed batch of slots, eager or captured once as a CUDA graph (what `LLM.generate` runs with
``cuda_graphs=True`` and what `longsparse bench decode` / `bench model` time).

Eager decode issues ~80 kernels per attention layer from Python, so at 32 layers a step costs the host several
milliseconds — enough to hide the GPU work (and the copy/compute overlap that SparDA is about) behind launch
overhead. A captured step replays the whole forward pass, the prefetch stream's copies included, with one launch.

Both steppers keep the tokens and positions on the device. The selectors' launches are sized for the cache capacity
(``ForwardBatch.max_seqlen``), so the eager steps before a capture compile exactly the kernels the graph records;
dense attention's split-KV kernel is launched over the whole capacity and reads each sequence's keys up to its
length on the device (``seqlens``); its SDPA fallback reads the whole capacity under a key mask. A captured step
advances the positions in place and, when ``greedy``, writes its argmax into its own token input, so replays run
back to back; otherwise the caller feeds the next tokens (:meth:`GraphStepper.feed`). After each replay the host
does what the captured Python cannot:
the block cache's lengths and the write-back of filled blocks (:meth:`BlockKVCache.finish_step`).
"""

from __future__ import annotations

import torch

from ..cache import BlockKVCache, CompressedKeys, GDNStates, KVCache
from ..cache.streams import COMPUTE
from ..models.batch import ForwardBatch


def _batch(
    lengths: list[int], cache: KVCache, compressed: CompressedKeys | None, capacity: int, dense: bool,
    device: torch.device, gdn_states: GDNStates | None = None,
) -> ForwardBatch:  # fmt: skip
    """The decode step of sequences in slots ``0 .. N − 1`` with ``lengths`` cached tokens each, launches sized for
    ``capacity``; ``dense``: dense attention reads the whole capacity under a key mask (``prefix_lens`` say
    ``capacity − 1``, the positions are the real ones); ``gdn_states``: a hybrid model's GDN layer states."""
    n = len(lengths)
    positions = torch.tensor(lengths, device=device)
    index = torch.arange(n, device=device)
    mask = None
    if dense:
        mask = (torch.arange(capacity, device=device) <= positions[:, None])[:, None, None, :]
    return ForwardBatch(
        is_decode=True, positions=positions, cu_seqlens=torch.arange(n + 1, device=device),
        offsets=list(range(n + 1)), prefix_lens=[capacity - 1] * n if dense else list(lengths),
        slots=list(range(n)), slot_index=index, token_slots=index, kv_cache=cache, compressed_keys=compressed,
        decode_mask=mask, seqlens=(positions + 1).to(torch.int32), max_seqlen=capacity, gdn_states=gdn_states,
    )  # fmt: skip


class EagerStepper:
    """One eager greedy step per :meth:`step` for sequences in slots ``0 .. N − 1`` at ``lengths`` tokens
    (``compressed``: the block-sparse modes' compressed keys, else None)."""

    def __init__(
        self, model, cache: KVCache, compressed: CompressedKeys | None, ids: torch.Tensor, lengths: list[int],
        capacity: int, dense: bool, gdn_states: GDNStates | None = None,
    ):  # fmt: skip
        self.model, self.cache, self.compressed, self.capacity, self.dense = model, cache, compressed, capacity, dense
        self.ids, self.lengths, self.gdn_states = ids, list(lengths), gdn_states

    def step(self) -> torch.Tensor:
        batch = _batch(self.lengths, self.cache, self.compressed, self.capacity, self.dense, self.ids.device,
                       self.gdn_states)  # fmt: skip
        logits = self.model.compute_logits(self.model(self.ids, batch))
        self.ids = logits.argmax(-1)
        self.lengths = [n + 1 for n in self.lengths]
        return logits


class GraphStepper:
    """The same step captured as a CUDA graph (continuing from ``ids`` / ``lengths``); :meth:`step` replays it.
    ``greedy``: the step feeds its own argmax to the next one (else :meth:`feed` gives the tokens).

    ``capture=False`` runs the captured function itself at every step instead (static buffers, in-place advances,
    host bookkeeping after the step — everything but the graph): the CPU tests check this path against
    :class:`EagerStepper`.
    """

    def __init__(
        self, model, cache: KVCache, compressed: CompressedKeys | None, ids: torch.Tensor, lengths: list[int],
        capacity: int, dense: bool, capture: bool = True, gdn_states: GDNStates | None = None, greedy: bool = True,
    ):  # fmt: skip
        device = ids.device
        self.model, self.cache, self.lengths, self.greedy = model, cache, list(lengths), greedy
        self.ids = ids.clone()
        self.keys = torch.arange(capacity, device=device) if dense else None
        self.batch = _batch(self.lengths, cache, compressed, capacity, dense, device, gdn_states)
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
            batch = self.batch
            self.logits = self.model.compute_logits(self.model(self.ids, batch))
            if self.greedy:
                self.ids.copy_(self.logits.argmax(-1))
            batch.positions.add_(1)
            batch.seqlens.add_(1)
            if self.keys is not None:
                batch.decode_mask.copy_((self.keys <= batch.positions[:, None])[:, None, None, :])
        finally:
            if self.block:
                self.cache.host_bookkeeping = True

    def feed(self, tokens: torch.Tensor) -> None:
        """The next step's input tokens ``[N]`` (with ``greedy=False``; a greedy step feeds itself)."""
        self.ids.copy_(tokens)

    def step(self) -> torch.Tensor:
        """One step; its logits ``[N, vocab]`` (a static buffer, overwritten by the next step)."""
        if self.block:
            self.cache.streams.wait(COMPUTE, "written")  # the previous write-back read ring slots
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()
        if self.block:
            self.cache.finish_step(self.batch.slots, self.lengths)
        self.lengths = [n + 1 for n in self.lengths]
        return self.logits
