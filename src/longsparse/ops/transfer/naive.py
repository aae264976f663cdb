"""Pure-torch references of the copy planner and the row copy: the specification the kernels must meet.

Slot layout of one offloaded attention layer (:class:`SlotMap`). Every (sequence slot ``s``, KV head ``h``) owns a
*row* of ``slots_per_row`` GPU slots, each holding one 64-token block's keys and values:

* slots ``0 .. init_blocks − 1``: the init blocks (block ``b`` in slot ``b``);
* the next ``local_blocks + 1`` slots: a ring over the local window and the partly filled tail block (block ``b`` in
  slot ``init_blocks + b % (local_blocks + 1)``); the window of the query in block ``qb`` is ``qb − local_blocks ..
  qb``, so the ring holds exactly the window's blocks;
* the last ``dynamic_slots`` slots: blocks chosen by score, copied in from host memory when selected and kept
  while they stay selected (and afterwards, until their slot is needed).

A block is *forced* for a query of ``seqlen`` tokens (block ``qb = (seqlen − 1) // block_size``) when
``b < init_blocks`` or ``b ≥ qb − local_blocks`` — the selectors' forced set (``sparse_attn.naive.forced_blocks``);
every other selected block is *dynamic*. Host row of block ``b``: ``s·host_seq_stride + h·host_head_stride +
host_offset + b``; GPU row of slot ``j``: ``gpu_offset + (s·Hkv + h)·slots_per_row + j`` (one buffer may hold several
layers: ``gpu_offset`` and ``host_offset`` place this layer in it).

The plan of one decode step (per row, independent of the other rows):

1. dynamic entries already in a dynamic slot are *hits* and keep it;
2. slots holding no selected block are *free*; the ``k``-th miss (in list order) takes the ``k``-th free slot (in
   slot order) and becomes a copy task (host row -> GPU row); unassigned free slots keep their old block, which a
   later step may hit again;
3. the block table gives every selected entry its slot in the layer (−1 for −1 entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

STAT_FIELDS = ("dynamic", "hits", "misses", "overflow")
"""Counters a plan accumulates, in this order: dynamic entries, hits, misses copied, misses left without a slot
(always 0 when ``dynamic_slots ≥ max_dynamic_blocks``; anything else is a sizing bug)."""


@dataclass(frozen=True)
class SlotMap:
    """Where the blocks of one offloaded attention layer live; see the module docstring."""

    block_size: int
    init_blocks: int
    local_blocks: int
    dynamic_slots: int
    num_kv_heads: int
    host_seq_stride: int
    host_head_stride: int
    host_offset: int = 0
    gpu_offset: int = 0

    def __post_init__(self):
        for name in ("block_size", "num_kv_heads", "host_head_stride"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("init_blocks", "local_blocks", "dynamic_slots", "host_seq_stride", "host_offset", "gpu_offset"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative int, got {getattr(self, name)!r}")

    @property
    def forced_slots(self) -> int:
        """Init slots plus the window ring (local blocks and the tail block)."""
        return self.init_blocks + self.local_blocks + 1

    @property
    def slots_per_row(self) -> int:
        return self.forced_slots + self.dynamic_slots

    def forced_slot(self, block: int) -> int:
        """Slot (within its row) of a forced block."""
        if block < self.init_blocks:
            return block
        return self.init_blocks + block % (self.local_blocks + 1)


def max_dynamic_blocks(config, max_len: int) -> int:
    """The most dynamic (non-forced) blocks one decode selection of ``config`` can hold for sequences of up to
    ``max_len`` tokens: the dynamic slots a row needs so that no miss is ever left without a slot.

    With the query in block ``qb``, the forced blocks are all of ``0 .. qb`` while ``qb − local ≤ init``, else
    ``init + local + 1`` of them and ``qb − local − init`` candidates remain. Below ``dense_len`` every candidate is
    selected (the most at the largest ``qb`` of a length below ``dense_len``); from ``dense_len`` on at most
    ``budget − forced`` are (the most at the longest length).
    """
    if not isinstance(max_len, int) or max_len <= 0:
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    init, local, blk = config.init_blocks, config.local_blocks, config.block_size
    last_qb = config.num_blocks(max_len) - 1

    def candidates(qb: int) -> int:
        return max(0, qb - local - init)

    most = 0
    if config.dense_len > 1:  # lengths below dense_len exist: the largest qb with qb·block + 1 < dense_len
        most = candidates(min(last_qb, -(-(config.dense_len - 1) // blk) - 1))
    if max_len >= config.dense_len:
        most = max(most, min(config.budget_blocks - (init + local + 1), candidates(last_qb)))
    return most


def _forced(sel: torch.Tensor, seqlen: int, m: SlotMap) -> torch.Tensor:
    qb = (seqlen - 1) // m.block_size
    return (sel >= 0) & ((sel < m.init_blocks) | (sel >= qb - m.local_blocks))


def plan_slot_copies_ref(
    selection: torch.Tensor,
    seqlens: torch.Tensor,
    seq_slots: torch.Tensor,
    resident: torch.Tensor,
    slot_map: SlotMap,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's plan for one decode step (module docstring); updates ``resident`` in place.

    ``selection [N, Hkv, W]`` int: each row's selected blocks (forced ones included, −1 padded), as the decode
    selectors return them; ``seqlens [N]`` tokens of each sequence including the new one; ``seq_slots [N]`` the cache
    sequence slot of each batch row; ``resident [S·Hkv, C]`` int32, the block held by each dynamic slot (−1 = none).

    Returns ``table [N, Hkv, W]`` int32 (the slot of each entry within the layer, −1 for −1 entries), ``src [M]`` and
    ``dst [M]`` int64 (host row and global GPU row of each copy, rows in batch order, misses in list order) and
    ``stats [4]`` int64 (:data:`STAT_FIELDS`).
    """
    N, H, W = selection.shape
    C = slot_map.dynamic_slots
    table = torch.full((N, H, W), -1, dtype=torch.int32)
    src, dst = [], []
    stats = torch.zeros(len(STAT_FIELDS), dtype=torch.int64)
    for n in range(N):
        seqlen, s = int(seqlens[n]), int(seq_slots[n])
        for h in range(H):
            row = s * H + h
            base = row * slot_map.slots_per_row
            sel = selection[n, h].long().cpu()
            res = resident[row].long().cpu()
            forced = _forced(sel, seqlen, slot_map)
            dynamic = (sel >= 0) & ~forced
            for e in forced.nonzero().flatten().tolist():
                table[n, h, e] = base + slot_map.forced_slot(int(sel[e]))
            held = {int(b): j for j, b in enumerate(res.tolist()) if b >= 0}
            selected = set(sel[dynamic].tolist())
            free = [j for j in range(C) if int(res[j]) not in selected]
            misses = [e for e in dynamic.nonzero().flatten().tolist() if int(sel[e]) not in held]
            stats += torch.tensor([int(dynamic.sum()), int(dynamic.sum()) - len(misses), 0, 0])
            for e in dynamic.nonzero().flatten().tolist():
                if int(sel[e]) in held:
                    table[n, h, e] = base + slot_map.forced_slots + held[int(sel[e])]
            for rank, e in enumerate(misses):
                if rank >= len(free):
                    stats[3] += 1
                    continue
                j = free[rank]
                block = int(sel[e])
                resident[row, j] = block
                table[n, h, e] = base + slot_map.forced_slots + j
                src.append(s * slot_map.host_seq_stride + h * slot_map.host_head_stride + slot_map.host_offset + block)
                dst.append(slot_map.gpu_offset + base + slot_map.forced_slots + j)
                stats[2] += 1
    device = selection.device
    return (
        table.to(device),
        torch.tensor(src, dtype=torch.int64, device=device),
        torch.tensor(dst, dtype=torch.int64, device=device),
        stats.to(device),
    )


def copy_rows_ref(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_rows: torch.Tensor,
    dst_rows: torch.Tensor,
    count: torch.Tensor | int | None = None,
) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for ``i < count`` (default: every entry), bit for bit.

    ``src [Rs, E]``, ``dst [Rd, E]`` of one dtype; ``dst_rows`` must not repeat a row (the result would depend on
    the order). ``count`` may be a one-element tensor (read here, on the host).
    """
    n = src_rows.shape[0] if count is None else int(count.reshape(-1)[0]) if torch.is_tensor(count) else int(count)
    if n == 0:
        return
    rows = src.index_select(0, src_rows[:n].to(src.device))
    dst.index_copy_(0, dst_rows[:n].to(dst.device), rows.to(dst.device))
