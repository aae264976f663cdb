"""Decode-time state: the attention layers' KV cache and the GDN layers' conv and recurrent states.

Each sequence of a generation owns a *slot*. :class:`KVCache` is the small interface the attention backends use —
store a step's keys/values, read a layer's keys/values for some slots (dense), hand out the blocks a block-sparse
decode step reads and hear when it is done with them, hear which blocks a forecast says will be read, report bytes by
location. Two caches implement it: :class:`ContiguousKVCache` (everything on one device) and the offloaded block
cache :class:`longsparse.cache.BlockKVCache` (pinned host memory behind a GPU block-slot cache, SparDA part 2).

The block-sparse layers' compressed keys live apart, in :class:`CompressedKeys`, whichever cache holds the keys and
values they summarise: SparDA keeps them on the GPU.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..models.base import CausalLM
from ..models.batch import ForwardBatch
from ..models.config import BaseConfig, HybridConfig
from ..ops.sparse_attn import (
    SparseAttentionConfig,
    decode_topk_counters,
    fill_compress_ring,
    resident_block_table,
    resident_slots,
)


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

    ``selection_log``: set it to a list to record ``(layer, block_ids)`` of every :meth:`block_slots` call (tests and
    the decode benchmark's in-run checks compare the blocks two caches were asked for).
    """

    selection_log: list[tuple[int, torch.Tensor]] | None = None
    resident = False
    """Whether every block of every sequence lies in GPU memory in this cache's own tensors (dense decode reads
    them all through :meth:`block_slots`)."""

    @abstractmethod
    def store(self, layer: int, batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the step's new keys and values ``k, v [T, Hkv, D]`` (packed as ``batch``: token ``i`` at position
        ``batch.positions[i]`` of slot ``batch.token_slots[i]``)."""

    @abstractmethod
    def gather(self, layer: int, slots: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[N, Hkv, length, D]`` of positions ``0 .. length − 1`` of ``slots`` (positions a slot has
        not written yet hold finite filler that the caller masks out)."""

    @abstractmethod
    def block_slots(
        self, layer: int, batch: ForwardBatch, block_ids: torch.Tensor, block_size: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :func:`longsparse.ops.sparse_attn.sparse_decode` reads for blocks ``block_ids [N, Hkv, S]`` (logical
        block numbers of ``block_size`` tokens, −1 = none) of the decode step ``batch``'s sequences:
        ``(k_slots, v_slots [num_block_slots, block_size, D], block_table [N, Hkv, S] int32)``, every listed block
        on the GPU (an offloaded cache waits here for the copies :meth:`prefetch` started, or copies now). The caller
        calls :meth:`release` once it has enqueued its reads."""

    @abstractmethod
    def release(self, layer: int) -> None:
        """The reads of ``layer``'s block slots handed out by :meth:`block_slots` this step are enqueued: an
        offloaded cache may reuse those slots once they have run."""

    @abstractmethod
    def prefetch(self, layer: int, batch: ForwardBatch, block_ids: torch.Tensor) -> None:
        """A hint: blocks ``block_ids [N, Hkv, S]`` of ``layer`` will be read later in the decode step ``batch``
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

    def store(self, layer, batch, k, v):
        self.keys[layer][batch.token_slots, :, batch.positions] = k
        self.values[layer][batch.token_slots, :, batch.positions] = v

    def gather(self, layer, slots, length):
        keys, values = self.keys[layer], self.values[layer]
        first = slots[0]
        if slots == list(range(first, first + len(slots))):
            return keys[first : first + len(slots), :, :length], values[first : first + len(slots), :, :length]
        index = torch.tensor(slots, device=keys.device)
        return keys[index, :, :length], values[index, :, :length]

    def block_slots(self, layer, batch, block_ids, block_size):
        """Views of the layer's tensors as ``[slots · Hkv · capacity / block_size, block_size, D]`` block slots (no
        copy: :func:`~longsparse.ops.sparse_attn.resident_slots`); needs ``capacity`` to be a multiple of
        ``block_size`` (the constructor and :func:`allocate_caches` round it up when given a block size)."""
        if self.capacity % block_size:
            raise ValueError(
                f"block-sparse reads need the KV cache capacity ({self.capacity}) to be a multiple of the block size "
                f"({block_size}); allocate it with allocate_caches(..., block_size={block_size})"
            )
        self._log_selection(layer, block_ids)
        k_slots = resident_slots(self.keys[layer], block_size)
        v_slots = resident_slots(self.values[layer], block_size)
        return k_slots, v_slots, resident_block_table(block_ids, self.capacity // block_size, rows=batch.slot_index)

    def release(self, layer):
        """Nothing to do: the slots are the cache's own tensors, never reused for other blocks."""

    def prefetch(self, layer, batch, block_ids):
        """Nothing to copy: every block already lies in this cache's tensors."""

    def nbytes(self) -> CacheBytes:
        return CacheBytes.of([*self.keys.values(), *self.values.values()])


class CompressedKeys:
    """Compressed keys of the block-sparse attention layers, per slot, in the model's dtype on its device (zeros
    before a prefill writes them):

    * ``k_cmp[layer] [slots, Ncap, Hkv, D]`` — ``K̃_j`` = mean of keys ``j·s … j·s + l − 1`` (``l, s`` the config's
      ``kernel_size``, ``kernel_stride``), the full windows of the sequence so far; ``Ncap`` = the windows of
      ``capacity`` tokens;
    * ``ring[layer] [slots, l, Hkv, D]`` — the last ``l`` keys (position ``p`` at ``p % l``), from which a decode step
      completes the next window (:func:`~longsparse.ops.sparse_attn.compress_decode_step`).

    A prefill writes both (:meth:`write_prefill`); each decode step appends in place. ``topk_counters [slots ·
    Hkv]`` (int32, zero) serve every decode selection of every layer as the row counters of a top-k fused into the
    scoring kernel (:func:`~longsparse.ops.sparse_attn.decode_topk_counters`; each selection leaves them zero).
    """

    def __init__(
        self,
        layers: Iterable[int],
        num_slots: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        config: SparseAttentionConfig,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        if num_slots <= 0 or capacity <= 0:
            raise ValueError(f"num_slots and capacity must be positive, got {num_slots} and {capacity}")
        self.config = config
        self.capacity = max(1, config.num_compressed(capacity))
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        ring = (num_slots, config.kernel_size, num_kv_heads, head_dim)
        cmp = (num_slots, self.capacity, num_kv_heads, head_dim)
        self.k_cmp = {i: torch.zeros(cmp, dtype=dtype, device=device) for i in layers}
        self.ring = {i: torch.zeros(ring, dtype=dtype, device=device) for i in self.k_cmp}
        self.topk_counters = decode_topk_counters(num_slots, num_kv_heads, device)

    @staticmethod
    def slot_bytes(
        config: SparseAttentionConfig, capacity: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one slot of one layer takes for sequences of up to ``capacity`` tokens (the capacity model's
        figure for what this class allocates)."""
        return (max(1, config.num_compressed(capacity)) + config.kernel_size) * num_kv_heads * head_dim * dtype.itemsize

    def write_prefill(self, layer: int, slot: int, k_cmp: torch.Tensor, keys: torch.Tensor) -> None:
        """Slot ``slot`` of ``layer`` now holds a sequence whose keys are ``keys [L, Hkv, D]`` and compressed keys
        ``k_cmp [N, Hkv, D]`` (``N = num_compressed(L)``)."""
        n = k_cmp.shape[0]
        if n > self.capacity:
            raise ValueError(f"{n} compressed keys do not fit the cache's {self.capacity} (capacity too small)")
        self.k_cmp[layer][slot, :n] = k_cmp
        lengths = torch.tensor([keys.shape[0]], device=keys.device)
        fill_compress_ring(keys[None], lengths, self.ring[layer][slot : slot + 1])

    def nbytes(self) -> CacheBytes:
        return CacheBytes.of([*self.k_cmp.values(), *self.ring.values()])


class GDNStates:
    """Per GDN layer: ``conv[layer] [slots, C, K − 1]`` (the last K − 1 conv inputs, model dtype) and
    ``recurrent[layer] [slots, HV, Dk, Dv]`` (the delta-rule state, float32). Zero means an empty sequence."""

    def __init__(
        self,
        layers: Iterable[int],
        num_slots: int,
        conv_dim: int,
        conv_kernel: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        layers = list(layers)
        self.conv = {i: torch.zeros(num_slots, conv_dim, conv_kernel - 1, dtype=dtype, device=device) for i in layers}
        self.recurrent = {
            i: torch.zeros(num_slots, num_v_heads, head_k_dim, head_v_dim, dtype=torch.float32, device=device)
            for i in layers
        }

    def reset(self, slots: list[int]) -> None:
        """Empty the states of ``slots`` (before reusing them for new sequences)."""
        for t in (*self.conv.values(), *self.recurrent.values()):
            t[slots] = 0

    def nbytes(self) -> CacheBytes:
        return CacheBytes.of([*self.conv.values(), *self.recurrent.values()])


def allocate_caches(
    config: BaseConfig,
    num_slots: int,
    capacity: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    block_size: int | None = None,
    kv_cache: bool = True,
) -> tuple[KVCache | None, GDNStates | None]:
    """A :class:`ContiguousKVCache` for the attention layers (``capacity`` tokens per slot, rounded up to a multiple
    of ``block_size`` if given, as block-sparse decoding needs; none when ``kv_cache`` is False, for a caller that
    builds another KV cache) and :class:`GDNStates` for the GDN layers; ``None`` for a kind the model does not have."""
    kv = None
    if config.attention_layers and kv_cache:
        kv = ContiguousKVCache(
            config.attention_layers, num_slots, capacity, config.num_key_value_heads, config.head_dim, dtype, device,
            block_size=block_size,
        )  # fmt: skip
    states = None
    if isinstance(config, HybridConfig) and config.gdn_layers:
        states = GDNStates(
            config.gdn_layers,
            num_slots,
            config.gdn_conv_dim,
            config.linear_conv_kernel_dim,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
            dtype,
            device,
        )
    return kv, states


def allocate_compressed_keys(model: CausalLM, num_slots: int, capacity: int) -> CompressedKeys | None:
    """:class:`CompressedKeys` for ``model``'s block-sparse attention layers (``capacity`` tokens per slot), in its
    dtype on its device; ``None`` when every attention layer is dense."""
    config = model.sparse_attention_config
    if not model.sparse_attention_layers or config is None:
        return None
    weight = model.lm_head.weight
    return CompressedKeys(
        model.sparse_attention_layers,
        num_slots,
        capacity,
        model.config.num_key_value_heads,
        model.config.head_dim,
        config,
        weight.dtype,
        weight.device,
    )
