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
back to back; otherwise the caller feeds the next tokens (:meth:`GraphStepper.feed`). The graph holds only the layers'
work: around each replay the host makes the KV cache's step calls that the captured Python cannot
(:meth:`~longsparse.cache.KVCache.begin_step`, and :meth:`~longsparse.cache.KVCache.end_step` — the block cache's
lengths and the write-back of filled blocks).
"""

from __future__ import annotations

import torch

from ..cache import CacheStep, CompressedKeys, GDNStates, KVCache
from ..models.batch import ForwardBatch


def _batch(
    lengths: list[int], cache: KVCache, compressed: CompressedKeys | None, capacity: int, dense: bool,
    device: torch.device, gdn_states: GDNStates | None = None,
) -> ForwardBatch:  # fmt: skip
    """The decode step of sequences in slots ``0 .. N − 1`` with ``lengths`` cached tokens each, launches sized for
    ``capacity``; ``dense``: dense attention reads the whole capacity under a key mask (``prefix_lens`` say
    ``capacity − 1``, the positions are the real ones: the cache's step calls get :func:`_cache_step`);
    ``gdn_states``: a hybrid model's GDN layer states."""
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


def _cache_step(batch: ForwardBatch, lengths: list[int]) -> CacheStep:
    """``batch`` as the KV cache's step calls see it: its buffers, with the sequences' real ``lengths``."""
    return CacheStep(
        is_decode=True, positions=batch.positions, cu_seqlens=batch.cu_seqlens, offsets=batch.offsets,
        prefix_lens=list(lengths), slots=batch.slots, slot_index=batch.slot_index, token_slots=batch.token_slots,
        seqlens=batch.seqlens,
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
        plan = self.model.plan_step(batch)
        step = _cache_step(batch, self.lengths)
        self.cache.begin_step(step)
        hidden = self.model(self.ids, batch, plan)
        self.cache.end_step(step)
        logits = self.model.compute_logits(hidden)
        self.ids = logits.argmax(-1)
        self.lengths = [n + 1 for n in self.lengths]
        return logits


class GraphStepper:
    """The same step captured as a CUDA graph (continuing from ``ids`` / ``lengths``); :meth:`step` replays it.
    ``greedy``: the step feeds its own argmax to the next one (else :meth:`feed` gives the tokens).

    ``capture=False`` runs the captured function itself at every step instead (static buffers, in-place advances,
    host bookkeeping after the step — everything but the graph): the CPU tests check this path against
    :class:`EagerStepper`. The step is planned once (``plan``: the dense layers' block table and the selections'
    counters stay where the graph recorded them); ``plan.stats`` adds up every run of the step function, which a
    replay does not run.
    """

    def __init__(
        self, model, cache: KVCache, compressed: CompressedKeys | None, ids: torch.Tensor, lengths: list[int],
        capacity: int, dense: bool, capture: bool = True, gdn_states: GDNStates | None = None, greedy: bool = True,
    ):  # fmt: skip
        device = ids.device
        self.model, self.cache, self.lengths, self.greedy, self.dense = model, cache, list(lengths), greedy, dense
        self.ids = ids.clone()
        self.keys = torch.arange(capacity, device=device) if dense else None
        self.batch = _batch(self.lengths, cache, compressed, capacity, dense, device, gdn_states)
        self.plan = model.plan_step(self.batch)
        self.graph = None
        if capture:
            graph = torch.cuda.CUDAGraph()
            with cache.graph_capture(), torch.cuda.graph(graph):
                self._forward()
            self.graph = graph

    def _forward(self) -> None:
        """One step on the static buffers, ending with the next step's token and positions in place."""
        batch = self.batch
        self.logits = self.model.compute_logits(self.model(self.ids, batch, self.plan))
        if self.greedy:
            self.ids.copy_(self.logits.argmax(-1))
        batch.positions.add_(1)
        batch.seqlens.add_(1)
        if self.keys is not None:
            batch.decode_mask.copy_((self.keys <= batch.positions[:, None])[:, None, None, :])

    def feed(self, tokens: torch.Tensor) -> None:
        """The next step's input tokens ``[N]`` (with ``greedy=False``; a greedy step feeds itself)."""
        self.ids.copy_(tokens)

    def step(self) -> torch.Tensor:
        """One step; its logits ``[N, vocab]`` (a static buffer, overwritten by the next step)."""
        step = _cache_step(self.batch, self.lengths)
        if not self.dense:  # the host lengths the layers' cache calls check (the captured ones ran at capture)
            self.batch.prefix_lens = step.prefix_lens
        self.cache.begin_step(step)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()
        self.cache.end_step(step)
        self.lengths = [n + 1 for n in self.lengths]
        return self.logits
