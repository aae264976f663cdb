"""The attention layers' KV cache contract, and its GPU-resident implementation.

Each sequence of a generation owns a *slot*. :class:`KVCache` is the small interface the attention backends use —
store a step's keys/values, read a layer's keys/values for some slots (dense), hand out the blocks a block-sparse
decode step reads and hear when it is done with them, hear which blocks a forecast says will be read, report bytes by
location. Two caches implement it: :class:`ContiguousKVCache` (everything on one device) and the offloaded block
cache :class:`~longsparse.cache.block_cache.BlockKVCache` (pinned host memory behind a GPU block-slot cache, SparDA
part 2). A step is described by a :class:`~longsparse.cache.step.CacheStep` (slots, positions, lengths).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from ..ops.sparse_attn import resident_block_table, resident_slots
from .step import CacheStep


@dataclass(frozen=True)
class CacheBytes:
    """Bytes held on the GPU and in host memory."""

    gpu: int = 0
    host: int = 0

    def __add__(self, other: CacheBytes) -> CacheBytes:
        return CacheBytes(self.gpu + other.gpu, self.host + other.host)

    @classmethod
    def of(cls, tensors: Iterable[torch.Tensor]) -> CacheBytes:
        gpu = host = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if t.device.type == "cuda":
                gpu += n
            else:
                host += n
        return cls(gpu, host)


class KVCache(ABC):
    """Keys and values of attention layers for a fixed set of sequence slots.

    A step's calls come in this order: :meth:`begin_step` once, then per attention layer :meth:`store` and (decode)
    :meth:`prefetch` / :meth:`block_slots` / :meth:`release` as the layers ask, then :meth:`end_step` once. Whoever
    runs the step (the engine's runner or a CUDA-graph stepper) makes the begin and end calls; the layers never do.
    A CUDA graph captures only the layers' calls (under :meth:`graph_capture`); its stepper calls :meth:`begin_step`
    and :meth:`end_step` on the host around every replay.

    ``selection_log``: set it to a list to record ``(layer, block_ids)`` of every :meth:`block_slots` call (tests and
    the decode benchmark's in-run checks compare the blocks two caches were asked for).
    """

    selection_log: list[tuple[int, torch.Tensor]] | None = None
    resident = False
    """Whether every block of every sequence lies in GPU memory in this cache's own tensors (dense decode reads
    them all through :meth:`block_slots`)."""

    @abstractmethod
    def begin_step(self, step: CacheStep) -> None:
        """Before the layers of ``step`` run: a cache whose previous step left work in flight orders this step after
        what it must wait for."""

    @abstractmethod
    def end_step(self, step: CacheStep) -> None:
        """After the last layer of ``step`` has stored its keys and values: a cache that keeps host-side lengths
        advances them here, and an offloaded one starts writing the blocks the step filled back to host memory."""

    def graph_capture(self) -> AbstractContextManager[None]:
        """A context to capture a step's layer calls in a CUDA graph under (default: nothing to arrange)."""
        return nullcontext()

    @abstractmethod
    def store(self, layer: int, step: CacheStep, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the step's new keys and values ``k, v [T, Hkv, D]`` (packed as ``step``: token ``i`` at position
        ``step.positions[i]`` of slot ``step.token_slots[i]``)."""

    @abstractmethod
    def gather(self, layer: int, slots: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[N, Hkv, length, D]`` of positions ``0 .. length − 1`` of ``slots`` (positions a slot has
        not written yet hold finite filler that the caller masks out)."""

    @abstractmethod
    def block_slots(
        self, layer: int, step: CacheStep, block_ids: torch.Tensor, block_size: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :func:`longsparse.ops.sparse_attn.sparse_decode` reads for blocks ``block_ids [N, Hkv, S]`` (logical
        block numbers of ``block_size`` tokens, −1 = none) of the decode step ``step``'s sequences:
        ``(k_slots, v_slots [num_block_slots, block_size, D], block_table [N, Hkv, S] int32)``, every listed block
        on the GPU (an offloaded cache waits here for the copies :meth:`prefetch` started, or copies now). The caller
        calls :meth:`release` once it has enqueued its reads."""

    @abstractmethod
    def release(self, layer: int) -> None:
        """The reads of ``layer``'s block slots handed out by :meth:`block_slots` this step are enqueued: an
        offloaded cache may reuse those slots once they have run."""

    @abstractmethod
    def prefetch(self, layer: int, step: CacheStep, block_ids: torch.Tensor) -> None:
        """A hint: blocks ``block_ids [N, Hkv, S]`` of ``layer`` will be read later in the decode step ``step``
        (SparDA's forecast, one attention layer early), and the same tensor will be passed to :meth:`block_slots`.
        A cache that keeps blocks off the GPU starts copying the missing ones here; one that keeps every block on the
        GPU has nothing to do."""

    @abstractmethod
    def nbytes(self) -> CacheBytes:
        """Bytes this cache holds, by location."""

    def _log_selection(self, layer: int, block_ids: torch.Tensor) -> None:
        if self.selection_log is not None:
            self.selection_log.append((layer, block_ids.clone()))


class ContiguousKVCache(KVCache):
    """One ``[slots, Hkv, capacity, D]`` tensor of keys and one of values per attention layer, on one device,
    zero-filled (masked positions must be finite: softmax weight 0 times NaN is NaN). ``block_size``: round
    ``capacity`` up to a multiple of it, as block-sparse decoding (:meth:`block_slots`) needs — and dense decoding's
    split-KV kernel (:data:`~longsparse.models.attention.DECODE_BLOCK`)."""

    resident = True

    def __init__(
        self,
        layers: Iterable[int],
        num_slots: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        block_size: int | None = None,
    ):
        if num_slots <= 0 or capacity <= 0:
            raise ValueError(f"num_slots and capacity must be positive, got {num_slots} and {capacity}")
        if block_size is not None:
            capacity = -(-capacity // block_size) * block_size
        self.capacity = capacity
        shape = (num_slots, num_kv_heads, capacity, head_dim)
        self.keys = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.values = {i: torch.zeros(shape, dtype=dtype, device=device) for i in self.keys}

    def begin_step(self, step):
        """Nothing to wait for: every write lands in this cache's own tensors on the compute stream."""

    def end_step(self, step):
        """Nothing to finish: this cache keeps no lengths and nothing off the device."""

    def store(self, layer, step, k, v):
        self.keys[layer][step.token_slots, :, step.positions] = k
        self.values[layer][step.token_slots, :, step.positions] = v

    def gather(self, layer, slots, length):
        keys, values = self.keys[layer], self.values[layer]
        first = slots[0]
        if slots == list(range(first, first + len(slots))):
            return keys[first : first + len(slots), :, :length], values[first : first + len(slots), :, :length]
        index = torch.tensor(slots, device=keys.device)
        return keys[index, :, :length], values[index, :, :length]

    def block_slots(self, layer, step, block_ids, block_size):
        """Views of the layer's tensors as ``[slots · Hkv · capacity / block_size, block_size, D]`` block slots (no
        copy: :func:`~longsparse.ops.sparse_attn.resident_slots`); needs ``capacity`` to be a multiple of
        ``block_size`` (the constructor and :func:`~longsparse.engine.allocate_caches` round it up when given a block
        size)."""
        if self.capacity % block_size:
            raise ValueError(
                f"block-sparse reads need the KV cache capacity ({self.capacity}) to be a multiple of the block size "
                f"({block_size}); allocate it with allocate_caches(..., block_size={block_size})"
            )
        self._log_selection(layer, block_ids)
        k_slots = resident_slots(self.keys[layer], block_size)
        v_slots = resident_slots(self.values[layer], block_size)
        return k_slots, v_slots, resident_block_table(block_ids, self.capacity // block_size, rows=step.slot_index)

    def release(self, layer):
        """Nothing to do: the slots are the cache's own tensors, never reused for other blocks."""

    def prefetch(self, layer, step, block_ids):
        """Nothing to copy: every block already lies in this cache's tensors."""

    def nbytes(self) -> CacheBytes:
        return CacheBytes.of([*self.keys.values(), *self.values.values()])
