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

from ..cache import BlockKVCache, CacheStep, CompressedKeys, GDNStates, KVCache
from ..models.batch import ForwardBatch
from ..models.plan import BlockFractions


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
    :class:`EagerStepper`; :meth:`capture` records the graph later. The step is planned once (``plan``: the dense
    layers' block table and the selections' counters stay where the graph recorded them); ``plan.stats`` adds up
    every run of the step function, which a replay does not run. ``pool``: the CUDA graph memory pool to capture in
    (graphs replayed one at a time may share one). :meth:`load` points the rows at other slots and lengths between
    steps (what :class:`GraphDecoder` does for a scheduler's changing batches).
    """

    def __init__(
        self, model, cache: KVCache, compressed: CompressedKeys | None, ids: torch.Tensor, lengths: list[int],
        capacity: int, dense: bool, capture: bool = True, gdn_states: GDNStates | None = None, greedy: bool = True,
        pool=None,
    ):  # fmt: skip
        device = ids.device
        self.model, self.cache, self.lengths, self.greedy, self.dense = model, cache, list(lengths), greedy, dense
        self.ids = ids.clone()
        self.keys = torch.arange(capacity, device=device) if dense else None
        self.batch = _batch(self.lengths, cache, compressed, capacity, dense, device, gdn_states)
        self.plan = model.plan_step(self.batch)
        self.graph = None
        if capture:
            self.capture(pool)

    def capture(self, pool=None) -> None:
        """Record one step as a CUDA graph (run the step function once uncaptured first: it compiles the kernels
        the graph records)."""
        graph = torch.cuda.CUDAGraph()
        with self.cache.graph_capture(), torch.cuda.graph(graph, pool=pool):
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

    def load(self, tokens: list[int], slots: list[int], lengths: list[int]) -> None:
        """The next step decodes ``tokens[n]`` at position ``lengths[n]`` of slot ``slots[n]`` (``N`` rows, as
        many as the stepper has). A captured graph reads the new values from its buffers; the host lists go to the
        caches' step calls (and to the layers' Python, which a graph with block-sparse layers ran once for the slots
        it was captured with: :class:`GraphDecoder` replays such a graph only for those slots)."""
        device = self.ids.device
        rows = torch.tensor([tokens, lengths, slots], dtype=torch.int64)
        rows = rows.pin_memory() if device.type == "cuda" else rows
        rows = rows.to(device, non_blocking=True)
        batch = self.batch
        self.ids.copy_(rows[0])
        batch.positions.copy_(rows[1])
        batch.seqlens.copy_(rows[1] + 1)
        batch.slot_index.copy_(rows[2])  # token_slots is the same tensor
        if self.keys is not None:
            batch.decode_mask.copy_((self.keys <= batch.positions[:, None])[:, None, None, :])
        self.lengths = list(lengths)
        batch.slots = list(slots)
        if not self.dense:
            batch.prefix_lens = list(lengths)

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


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes :class:`GraphDecoder` captures: powers of two below ``max_num_seqs``, and ``max_num_seqs``."""
    sizes = {max_num_seqs}
    size = 1
    while size < max_num_seqs:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


class GraphDecoder:
    """Decode steps of a continuous-batching engine: whichever slots decode in a step, the step replays a graph
    captured once (a :class:`GraphStepper` per graph, run uncaptured at its first use, which compiles the kernels,
    and captured at its second; ``capture=False``: never captured, the CPU path).

    A step's ``R`` rows are padded with idle slots (``free``: slots no request holds; the padding rows decode token 0
    at position 0 there, a slot's state a new request's prefill overwrites, and their outputs are dropped):

    * a model without block-sparse layers reads slots only through device tensors, so one graph serves any slots of
      a batch size: the smallest of :func:`batch_buckets` with room for ``R`` and enough idle slots to pad to it
      (else exactly ``R``);
    * the block-sparse layers' Python picks views of the compressed keys by slot number, which a graph keeps: a
      graph serves the slots it was captured with, so a step reuses one whose slots hold its own and otherwise idle
      ones, or captures one for its slots and every idle slot (at most ``max_graphs`` are kept, least recently used
      first out).

    The block KV cache's host lengths of padding slots are reset before each step. Statistics (``stats``: the block
    fractions attended) come from the uncaptured runs without padding rows, as a replay runs no Python.
    """

    def __init__(
        self, model, cache: KVCache, compressed: CompressedKeys | None, gdn_states: GDNStates | None, capacity: int,
        max_num_seqs: int, *, capture: bool, max_graphs: int = 8,
    ):  # fmt: skip
        self.model, self.cache, self.compressed, self.gdn_states = model, cache, compressed, gdn_states
        self.capacity, self.max_num_seqs, self.capture, self.max_graphs = capacity, max_num_seqs, capture, max_graphs
        self.device = model.lm_head.weight.device
        self.slot_bound = bool(model.sparse_attention_layers)
        # dense attention layers are launched over the whole capacity (their kernel stops at each sequence's length on
        # the device; the SDPA fallback masks), so that the captured shapes are static
        self.dense = len(model.sparse_attention_layers) < len(model.config.attention_layers)
        self.buckets = batch_buckets(max_num_seqs)
        self.steppers: dict[int | tuple[int, ...], GraphStepper] = {}
        self.stats = BlockFractions()
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    @property
    def graphs(self) -> int:
        """Graphs captured and kept."""
        return sum(s.graph is not None for s in self.steppers.values())

    def step(self, tokens: list[int], slots: list[int], lengths: list[int], free: list[int]) -> torch.Tensor:
        """Decode ``tokens[n]`` at position ``lengths[n]`` of slot ``slots[n]``; logits ``[R, vocab]`` in that order."""
        key, rows = self._rows(slots, free)
        token_of, length_of = dict(zip(slots, tokens)), dict(zip(slots, lengths))
        padded = len(rows) > len(slots)
        if padded and isinstance(self.cache, BlockKVCache):
            self.cache.reset([s for s in rows if s not in token_of])
        row_tokens = [token_of.get(s, 0) for s in rows]
        row_lengths = [length_of.get(s, 0) for s in rows]
        stepper = self.steppers.pop(key, None)
        fresh = stepper is None
        if fresh:
            stepper = GraphStepper(
                self.model, self.cache, self.compressed, torch.zeros(len(rows), dtype=torch.int64, device=self.device),
                row_lengths, self.capacity, self.dense, capture=False, gdn_states=self.gdn_states, greedy=False,
            )  # fmt: skip
        stepper.load(row_tokens, rows, row_lengths)
        if self.capture and not fresh and stepper.graph is None:
            stepper.capture(self.pool)
        self.steppers[key] = stepper  # most recently used last
        while len(self.steppers) > self.max_graphs:
            self.steppers.pop(next(iter(self.steppers)))
        fractions = stepper.plan.stats.block_fractions
        before = (fractions.total, fractions.rows)
        logits = stepper.step()
        if stepper.graph is None and not padded:
            self.stats.add(fractions.total - before[0], fractions.rows - before[1])
        order = {s: i for i, s in enumerate(rows)}
        return logits[[order[s] for s in slots]]

    def _rows(self, slots: list[int], free: list[int]) -> tuple[int | tuple[int, ...], list[int]]:
        """The step's graph key and its rows' slots (``slots`` and the padding)."""
        need = len(slots)
        if not self.slot_bound:
            size = next((b for b in self.buckets if b >= need and b - need <= len(free)), need)
            return size, list(slots) + sorted(free)[: size - need]
        mine, idle = set(slots), set(free)
        for key in reversed(list(self.steppers)):
            if mine <= set(key) and set(key) - mine <= idle:
                return key, list(key)
        key = tuple(sorted(mine | idle))
        return key, list(key)
