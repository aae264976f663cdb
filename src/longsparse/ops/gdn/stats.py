"""What a SparseGDN call reports about its selection, from either backend (``sparse.py``, ``launch.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import ChunkLayout
from .selection import Selection


@dataclass(frozen=True)
class SparseGDNStats:
    """What the selector chose in one call (tensors on the inputs' device; building it reads nothing back to the host).

    Attributes:
        keep_ratio: selected events / all (sequence, pair, chunk) events of the call (NaN with no chunks); a host
            float, so reading it waits for the device — ``keep_ratio_device`` is the same as a 0-dim float64 tensor.
        keep_ratio_per_seq: ``[N]`` the same per sequence (NaN for an empty sequence).
        events_per_pair: ``[N, P]`` selected events of each (sequence, pair).
        tiers: ``[N, P]`` 0 low, 1 mid, 2 high. tier_k: ``[N, 3]`` chunks kept by a low / mid / high pair.
        n_high, n_mid: ``[N]`` pairs in the high and mid tiers. chunks_per_seq: ``[N]`` C of each sequence.
        num_events: E. num_snapshots: states the recurrence kept for the output and the final state.
        mask: ``[N, P, Cmax]`` the event mask (False past each sequence's end).
        lifetime, visibility: ``[N, HV]`` L_h and G_h. gain_mid, gain_high: ``[N, P]`` normalised gains x_M, x_H.
    """

    keep_ratio_per_seq: torch.Tensor
    events_per_pair: torch.Tensor
    tiers: torch.Tensor
    tier_k: torch.Tensor
    n_high: torch.Tensor
    n_mid: torch.Tensor
    chunks_per_seq: torch.Tensor
    num_snapshots: int
    mask: torch.Tensor
    lifetime: torch.Tensor
    visibility: torch.Tensor
    gain_mid: torch.Tensor
    gain_high: torch.Tensor

    @classmethod
    def from_selection(cls, sel: Selection, layout: ChunkLayout, num_snapshots: int = 0) -> SparseGDNStats:
        """Stats of a selection; ``num_snapshots`` is how many intermediate states the recurrence stored (the GPU
        path's walk main pass stores none: its segments rebuild their entry states in registers; its csr main pass
        stores one per event)."""
        P = sel.mask.shape[1]
        chunks = layout.chunks_per_seq
        per_pair = sel.mask.sum(-1)
        return cls(
            keep_ratio_per_seq=per_pair.sum(-1).double() / (P * chunks).double(),
            events_per_pair=per_pair,
            tiers=sel.tier,
            tier_k=sel.tier_k,
            n_high=sel.n_high,
            n_mid=sel.n_mid,
            chunks_per_seq=chunks,
            num_snapshots=num_snapshots,
            mask=sel.mask,
            lifetime=sel.lifetime,
            visibility=sel.visibility,
            gain_mid=sel.gain_mid,
            gain_high=sel.gain_high,
        )

    @property
    def num_events(self) -> int:
        """E, the selected events of the call (reads the device)."""
        return int(self.events_per_pair.sum())

    @property
    def keep_ratio_device(self) -> torch.Tensor:
        """0-dim float64 tensor: selected events / all events (NaN with no chunks), without a host read — what a
        model adds up over its layers and reads once per step."""
        total = self.events_per_pair.shape[1] * self.chunks_per_seq.sum()
        return self.events_per_pair.sum().double() / total.double()

    @property
    def keep_ratio(self) -> float:
        """:attr:`keep_ratio_device` as a float (reads the device)."""
        return float(self.keep_ratio_device)
