"""Geometry of the block KV cache: which layers are offloaded, how rows are numbered, how many bytes live where.

A *row* is one KV head's keys and values of one 64-token block, ``[2, block, d]`` contiguous (32 KiB for MiniCPM4's
block 64, d = 128 in bf16): the unit the planner, the copy kernel and the decode kernel address.

* **Resident layers** keep every block on the GPU: ``[S, Hkv, NB]`` rows per layer, block ``b`` of (sequence slot
  ``s``, head ``h``) in row ``(s·Hkv + h)·NB + b`` (:func:`~longsparse.ops.sparse_attn.resident_slots`' layout).
  SparDA keeps its first attention layer resident (nothing earlier forecasts it).
* **Offloaded layers** keep ``slots_per_row`` GPU rows per (s, h) — init blocks, the local-window ring with the tail
  block, and ``dynamic_slots`` rows for blocks chosen by score (:class:`~longsparse.ops.transfer.SlotMap`) — and every
  full block in host memory, sequence-major: ``[S, L_off, Hkv, NB]`` rows, so one sequence's blocks are one
  contiguous range (admitting or dropping a sequence never moves another's).

``NB`` = blocks of ``capacity`` tokens. The compressed keys of every block-sparse layer stay on the GPU, apart from
this layout (:class:`~longsparse.cache.compressed_keys.CompressedKeys`; the capacity model adds their bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..ops.sparse_attn import SparseAttentionConfig
from ..ops.transfer import STAT_FIELDS, SlotMap, max_dynamic_blocks


@dataclass(frozen=True)
class BlockLayout:
    """Placement of a block KV cache for ``num_seqs`` sequences of up to ``capacity`` tokens.

    ``layers``: the model's attention layers in order; ``offloaded``: those whose full blocks live in host memory (the
    rest are resident on the GPU).
    """

    config: SparseAttentionConfig
    layers: tuple[int, ...]
    offloaded: tuple[int, ...]
    num_seqs: int
    capacity: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def __post_init__(self):
        if not isinstance(self.config, SparseAttentionConfig):
            raise ValueError(f"config must be a SparseAttentionConfig, got {type(self.config).__name__}")
        if not self.layers or list(self.layers) != sorted(set(self.layers)) or min(self.layers) < 0:
            raise ValueError(f"layers must be distinct ascending layer indices, got {self.layers}")
        if not set(self.offloaded) <= set(self.layers) or list(self.offloaded) != sorted(set(self.offloaded)):
            raise ValueError(f"offloaded {self.offloaded} must be an ascending subset of layers {self.layers}")
        for name in ("num_seqs", "capacity", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not self.dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {self.dtype}")

    @property
    def resident(self) -> tuple[int, ...]:
        return tuple(layer for layer in self.layers if layer not in self.offloaded)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def blocks_per_seq(self) -> int:
        return self.config.num_blocks(self.capacity)

    @cached_property
    def dynamic_slots(self) -> int:
        """Dynamic slots per (sequence, head) row: the most non-forced blocks one decode selection can hold."""
        return max_dynamic_blocks(self.config, self.capacity)

    @property
    def forced_slots(self) -> int:
        return self.config.init_blocks + self.config.local_blocks + 1

    @property
    def slots_per_row(self) -> int:
        return self.forced_slots + self.dynamic_slots

    @property
    def row_elems(self) -> int:
        return 2 * self.block_size * self.head_dim

    @property
    def row_bytes(self) -> int:
        return self.row_elems * self.dtype.itemsize

    @property
    def host_rows(self) -> int:
        return self.num_seqs * len(self.offloaded) * self.num_kv_heads * self.blocks_per_seq

    @property
    def slot_rows(self) -> int:
        """GPU rows of the offloaded layers' slots (all layers in one buffer)."""
        return len(self.offloaded) * self.num_seqs * self.num_kv_heads * self.slots_per_row

    @property
    def resident_rows_per_layer(self) -> int:
        return self.num_seqs * self.num_kv_heads * self.blocks_per_seq

    def offload_index(self, layer: int) -> int:
        """Position of ``layer`` among the offloaded layers."""
        if layer not in self.offloaded:
            raise ValueError(f"layer {layer} is not offloaded (offloaded: {self.offloaded})")
        return self.offloaded.index(layer)

    def slot_map(self, layer: int) -> SlotMap:
        """Where the blocks of offloaded ``layer`` live (host rows and global GPU slot rows)."""
        li = self.offload_index(layer)
        nb, heads = self.blocks_per_seq, self.num_kv_heads
        return SlotMap(
            block_size=self.block_size,
            init_blocks=self.config.init_blocks,
            local_blocks=self.config.local_blocks,
            dynamic_slots=self.dynamic_slots,
            num_kv_heads=heads,
            host_seq_stride=len(self.offloaded) * heads * nb,
            host_head_stride=nb,
            host_offset=li * heads * nb,
            gpu_offset=li * self.num_seqs * heads * self.slots_per_row,
        )

    def host_row(self, layer: int, seq: int, head: int, block: int) -> int:
        m = self.slot_map(layer)
        return seq * m.host_seq_stride + head * m.host_head_stride + m.host_offset + block

    def gpu_bytes(self) -> int:
        """Bytes the cache allocates on the GPU: block rows, plan buffers, counters."""
        heads, seqs = self.num_kv_heads, self.num_seqs
        rows = self.slot_rows + len(self.resident) * self.resident_rows_per_layer
        c = self.dynamic_slots
        width = self.config.decode_width()
        plans = len(self.offloaded) * (seqs * heads * width * 4 + 2 * 8 * max(1, seqs * heads * c) + 4)
        plans += len(self.resident) * seqs * heads * width * 4  # block tables of the resident layers
        metadata = len(self.offloaded) * (seqs * heads * c * 4 + len(STAT_FIELDS) * 8)
        return rows * self.row_bytes + plans + metadata

    def host_bytes(self) -> int:
        """Bytes of the host block store (pinned on a GPU machine)."""
        return self.host_rows * self.row_bytes
