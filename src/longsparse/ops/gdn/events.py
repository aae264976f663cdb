"""From an event mask to the arrays the recurrence and output kernels walk (all on the device, no host sync).

Given the selection ``mask [N, P, Cmax]`` (sequence, head pair, chunk within the sequence) and the tier of each pair
``tier [N, P]`` (0 low, 1 mid, 2 high), :func:`plan_events` lays the events out in CSR order — one row per
(sequence, pair), rows of a sequence ordered high, mid, low (pair index breaks ties) so that the longest chains are
scheduled first, events of a row in time order — and decides which states the output groups read:

* ``row_ptr [R + 1]``, ``row_seq [R]``, ``row_pair [R]`` with ``R = N · P``;
* ``event_chunk [E_cap]`` packed chunk id of each event; ``event_snap [E_cap]`` its snapshot slot or −1;
* ``group_snap [NG, P]`` the slot holding the state after a group's predecessor event (the last selected chunk
  before the group) or −1, and ``group_pred [NG, P]`` that predecessor's packed chunk id or −1;
* ``prefix [NC, HV]`` float64, the sequence-local exclusive prefix of the chunk decays γ (``P_c`` in the notes).

Buffers are sized by host-known bounds (``E_cap = N · P · Cmax``; snapshots bounded by the number of groups and the
largest tier's budget), so the actual event count never has to travel to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chunks import ChunkTable


@dataclass(frozen=True)
class OutputGroups:
    """Output groups in packed order: first chunk ``chunk [NG]``, ``size [NG]`` (1 or 2), ``seq [NG]``, and the
    first chunk's index within its sequence ``pos [NG]``."""

    chunk: torch.Tensor
    size: torch.Tensor
    seq: torch.Tensor
    pos: torch.Tensor

    @property
    def count(self) -> int:
        return self.chunk.numel()

    @classmethod
    def build(cls, table: ChunkTable, group_chunks: int, device) -> OutputGroups:
        """Groups of ``group_chunks`` (2: the mapped grouped output; 1: per-chunk output) consecutive chunks."""
        chunk, size, seq, pos = [], [], [], []
        offs = table.seq_offsets_host
        for n in range(table.num_seqs):
            C = offs[n + 1] - offs[n]
            for c in range(0, C, group_chunks):
                chunk.append(offs[n] + c)
                size.append(min(group_chunks, C - c))
                seq.append(n)
                pos.append(c)

        def t(x):
            return torch.tensor(x, dtype=torch.int32, device=device)

        return cls(t(chunk), t(size), t(seq), t(pos))


@dataclass(frozen=True)
class EventPlan:
    row_ptr: torch.Tensor
    row_seq: torch.Tensor
    row_pair: torch.Tensor
    event_chunk: torch.Tensor
    event_snap: torch.Tensor
    group_snap: torch.Tensor
    group_pred: torch.Tensor
    prefix: torch.Tensor
    snapshot_capacity: int

    @property
    def num_rows(self) -> int:
        return self.row_seq.numel()


def decay_prefix(gamma: torch.Tensor, table: ChunkTable) -> torch.Tensor:
    """Sequence-local exclusive prefix of the chunk decays: ``P[c] = Σ_{j < c in its sequence} γ_j``, float64."""
    g64 = gamma.double()
    excl = g64.cumsum(0) - g64
    first = table.seq_offsets[:-1].long()[table.seq.long()]
    return excl - excl[first]


def snapshot_bound(table: ChunkTable, pairs: int, max_keep: list[int]) -> int:
    """Upper bound on the snapshots: per (sequence, pair), at most one per output group and one per event."""
    offs = table.seq_offsets_host
    return sum(pairs * min(-(-(offs[n + 1] - offs[n]) // 2), max_keep[n]) for n in range(table.num_seqs))


def plan_events(mask: torch.Tensor, tier: torch.Tensor, table: ChunkTable, groups: OutputGroups,
                gamma: torch.Tensor, snapshot_capacity: int) -> EventPlan:
    """Lay out the events of ``mask [N, P, Cmax]`` (False past each sequence's chunks) as described above."""
    N, P, Cmax = mask.shape
    dev = mask.device
    order = torch.argsort((2 - tier.long()) * P + torch.arange(P, device=dev), dim=1)  # [N, P] pair of each row
    rank = torch.argsort(order, dim=1)  # row of each pair within its sequence
    rows_mask = mask.gather(1, order[..., None].expand(N, P, Cmax))
    counts = rows_mask.sum(-1).flatten()
    row_ptr = torch.zeros(N * P + 1, dtype=torch.int32, device=dev)
    row_ptr[1:] = counts.cumsum(0)

    e_cap = N * P * Cmax
    pos_in_row = rows_mask.long().cumsum(-1) - 1
    dest = torch.where(rows_mask, row_ptr[:-1].view(N, P, 1).long() + pos_in_row, e_cap)
    seq_first = table.seq_offsets[:-1].long().view(N, 1, 1)
    chunk_ids = (seq_first + torch.arange(Cmax, device=dev)).expand(N, P, Cmax)
    event_chunk = torch.zeros(e_cap + 1, dtype=torch.int32, device=dev)
    event_chunk.scatter_(0, dest.flatten(), chunk_ids.flatten().int())

    # Predecessor of each group: the last selected chunk before the group's first chunk.
    idx = torch.arange(Cmax, device=dev).expand(N, P, Cmax)
    last_sel = torch.where(mask, idx, -1).cummax(-1).values  # [N, P, Cmax]
    g_seq, g_pos = groups.seq.long(), groups.pos.long()
    before = (g_pos - 1).clamp_min(0)
    pred_local = last_sel[g_seq, :, before]  # [NG, P]
    pred_local = torch.where((g_pos > 0)[:, None], pred_local, -1)
    has_pred = pred_local >= 0
    sel_count = mask.long().cumsum(-1)  # events up to and including each chunk
    pairs = torch.arange(P, device=dev)[None, :]
    pred_rank = sel_count[g_seq[:, None], pairs, pred_local.clamp_min(0)] - 1  # [NG, P] position within the pair's row
    pair_row = g_seq[:, None] * P + rank[g_seq]  # [NG, P]
    pred_event = torch.where(has_pred, row_ptr[pair_row].long() + pred_rank, e_cap)

    needed = torch.zeros(e_cap + 1, dtype=torch.int32, device=dev)
    needed.scatter_(0, pred_event.flatten(), torch.ones_like(pred_event.flatten(), dtype=torch.int32))
    needed[e_cap] = 0
    slot_of_event = torch.where(needed.bool(), needed.cumsum(0) - 1, -1).int()
    group_snap = torch.where(has_pred, slot_of_event[pred_event], -1).int()
    group_pred = torch.where(has_pred, table.seq_offsets[:-1].long()[g_seq][:, None] + pred_local, -1).int()

    return EventPlan(
        row_ptr=row_ptr,
        row_seq=torch.arange(N, device=dev, dtype=torch.int32).repeat_interleave(P),
        row_pair=order.flatten().int(),
        event_chunk=event_chunk[:e_cap],
        event_snap=slot_of_event[:e_cap],
        group_snap=group_snap,
        group_pred=group_pred,
        prefix=decay_prefix(gamma, table),
        snapshot_capacity=snapshot_capacity,
    )
