"""CSR layout of the selected events (SparseGDN (Zhuang et al., arXiv:2610.41420) Sec. 2.5, Eq. 16) and the
metadata the recurrence and output consume.

Rows: one per (sequence, pair), R = N · P. Within a sequence the rows are its pairs ordered high, mid, low tier
(pair index breaks ties), so the longest event chains come first; sequence n owns rows ``n·P .. n·P + P − 1``.
Events of a row are its selected chunks in time order.

Output groups: the output reads states at group entries. Group r of a sequence covers its chunks
``span·r .. span·r + span − 1`` (span 2 for the grouped output, 1 for the per-chunk output) and enters at chunk
``span·r``; its entry state is recovered from the last selected event before the entry (``group_pred``) and the decay
prefix: ``S_entry = e^{P[entry] − P[pred] − γ[pred]} S_after[pred]`` or ``e^{P[entry]} S_0`` without a predecessor.

Decay prefixes are float64 whatever the compute dtype: they are differences of long sums (a 128K-token sequence with
mean g = −0.1 reaches |P| ≈ 1.3e4, where float32 spacing is ~1e-3), so a float32 prefix would lose the bridging
factors' precision to cancellation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layout import ChunkLayout


@dataclass(frozen=True)
class EventLayout:
    """The event CSR (int64 index tensors, float64 decay tensors, all on the inputs' device).

    Attributes:
        N, P, group: sequences, pairs, value heads per pair (value head ``p·group + i`` is head i of pair p).
        span: chunks per output group (2 grouped, 1 per-chunk). E: selected events. num_snapshots: NS.
        row_ptr: ``[R + 1]`` events of row r are ``row_ptr[r] .. row_ptr[r+1] − 1``; ``row_ptr[R] = E``.
        row_pair, row_seq, row_tier: ``[R]`` pair, sequence and tier (0 low, 1 mid, 2 high) of each row.
        pair_row: ``[N, P]`` the row of (sequence, pair).
        event_chunk: ``[E]`` packed chunk id of each event (``layout.chunk_pos`` gives its in-sequence index).
        event_row: ``[E]`` the row each event belongs to.
        group_pred: ``[N, P, Gmax]`` (Gmax = ceil(Cmax / span)) index into the event arrays of the last selected event
            of (sequence, pair) with in-sequence chunk < span·r, or -1 (none, or group r past the sequence's end).
        event_snapshot: ``[E]`` slot in the snapshot store of the state after event e, or -1 when no output group
            and no final state needs it. Kept: every ``group_pred`` target and the last event of every row.
        decay_prefix: ``[HV, NC]`` float64 P_c, the sequence-local exclusive prefix of the chunk log decays γ
            (P = 0 at a sequence's first chunk; Eq. 19).
        decay_total: ``[HV, N]`` float64 P_C, the sum of γ over each sequence (the final state's bridging prefix).
    """

    N: int
    P: int
    group: int
    span: int
    E: int
    num_snapshots: int
    row_ptr: torch.Tensor
    row_pair: torch.Tensor
    row_seq: torch.Tensor
    row_tier: torch.Tensor
    pair_row: torch.Tensor
    event_chunk: torch.Tensor
    event_row: torch.Tensor
    group_pred: torch.Tensor
    event_snapshot: torch.Tensor
    decay_prefix: torch.Tensor
    decay_total: torch.Tensor

    @property
    def row_len(self) -> torch.Tensor:
        """``[R]`` events per row."""
        return self.row_ptr[1:] - self.row_ptr[:-1]

    def row_heads(self) -> torch.Tensor:
        """``[R, group]`` value heads of each row's pair."""
        return self.row_pair[:, None] * self.group + torch.arange(self.group, device=self.row_pair.device)

    def event_heads(self) -> torch.Tensor:
        """``[E, group]`` value heads of each event's pair."""
        return self.row_heads()[self.event_row]


def decay_prefixes(layout: ChunkLayout, gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P [HV, NC], P_C [HV, N])`` in float64 from the chunk log decays ``gamma [HV, NC]``."""
    grid = layout.to_grid(gamma.to(torch.float64), 0.0)  # [HV, N, Cmax]
    inclusive = grid.cumsum(-1)
    return layout.from_grid(inclusive - grid), grid.sum(-1)


def build_events(
    layout: ChunkLayout, mask: torch.Tensor, tier: torch.Tensor, gamma: torch.Tensor, group: int, span: int
) -> EventLayout:
    """CSR of the events of ``mask [N, P, Cmax]`` with rows ordered by ``tier [N, P]`` (descending, stable), the
    output predecessors for groups of ``span`` chunks, the snapshot slots, and the decay prefixes of
    ``gamma [HV, NC]``."""
    N, P, Cmax = mask.shape
    dev = mask.device
    pair_order = torch.sort(tier, dim=-1, descending=True, stable=True).indices  # [N, P]
    R = N * P
    rows = torch.arange(R, device=dev)
    row_pair = pair_order.reshape(R)
    row_seq = rows // P
    row_tier = tier.gather(1, pair_order).reshape(R)
    pair_row = torch.empty_like(pair_order).scatter_(1, pair_order, rows.view(N, P))
    row_mask = mask.gather(1, pair_order[..., None].expand(N, P, Cmax)).reshape(R, Cmax)
    row_ptr = torch.zeros(R + 1, dtype=torch.int64, device=dev)
    row_ptr[1:] = row_mask.sum(-1).cumsum(0)
    event_row, event_pos = row_mask.nonzero(as_tuple=True)
    event_chunk = layout.seq_chunk_offsets[row_seq[event_row]] + event_pos
    E = event_chunk.numel()

    before = mask.long().cumsum(-1) - mask.long()  # [N, P, Cmax] selected chunks strictly before c
    entries = torch.arange(0, Cmax, span, device=dev)
    before_entry = before[..., entries]  # [N, P, Gmax]
    exists = entries < layout.chunks_per_seq[:, None, None]
    group_pred = torch.where(
        exists & (before_entry > 0), row_ptr[pair_row][..., None] + before_entry - 1, torch.full_like(before_entry, -1)
    )

    needed = torch.zeros(E, dtype=torch.bool, device=dev)
    needed[group_pred[group_pred >= 0]] = True
    row_len = row_ptr[1:] - row_ptr[:-1]
    needed[row_ptr[1:][row_len > 0] - 1] = True
    event_snapshot = torch.where(needed, needed.long().cumsum(0) - 1, torch.full_like(event_chunk, -1))
    decay_prefix, decay_total = decay_prefixes(layout, gamma)
    return EventLayout(
        N=N,
        P=P,
        group=group,
        span=span,
        E=E,
        num_snapshots=int(needed.sum()),
        row_ptr=row_ptr,
        row_pair=row_pair,
        row_seq=row_seq,
        row_tier=row_tier,
        pair_row=pair_row,
        event_chunk=event_chunk,
        event_row=event_row,
        group_pred=group_pred,
        event_snapshot=event_snapshot,
        decay_prefix=decay_prefix,
        decay_total=decay_total,
    )
