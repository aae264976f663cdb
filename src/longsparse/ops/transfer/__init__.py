"""Host <-> GPU block transfers for the offloaded KV cache: the copy planner and the persistent UVA copy kernel.

* :func:`plan_slot_copies` diffs one layer's new block selection against the blocks already resident in its GPU
  slots: hits keep their slot, misses get freed slots, and the misses become a list of row copies (host row -> GPU
  slot row) plus the block table the decode kernel reads.
* :func:`copy_rows` moves rows between two row-major buffers by index lists: from pinned host memory into GPU slots
  (the prefetch), or from GPU slots into pinned host memory (write-back of filled blocks). On a GPU a persistent
  Triton kernel reads or writes host memory directly through unified virtual addressing (UVA); elsewhere a torch
  ``index_copy_`` with the same semantics runs.

Each op has a pure-torch reference in ``naive.py``.
"""

from .copy import copy_rows, default_cta_quota
from .naive import STAT_FIELDS, SlotMap, copy_rows_ref, max_dynamic_blocks, plan_slot_copies_ref
from .plan import CopyPlan, plan_slot_copies

__all__ = [
    "STAT_FIELDS",
    "CopyPlan",
    "SlotMap",
    "copy_rows",
    "copy_rows_ref",
    "default_cta_quota",
    "max_dynamic_blocks",
    "plan_slot_copies",
    "plan_slot_copies_ref",
]
