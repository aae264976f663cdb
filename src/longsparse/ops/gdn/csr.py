"""The event CSR of the csr main pass (``kernels/recur.py``, ``kernels/output.py``), built on the device from the
event mask.

Rows are the (sequence, pair)s in natural order, row ``r = n·P + p`` (the specification orders a sequence's rows by
tier, which only schedules work; here the kernels' grid does the scheduling). A row's events are its selected chunks
in time order. Everything is cumulative sums and one scatter: no ``nonzero``, no event count copied to the host. The
buffers indexed by event (U' and the state after each event) are sized by :func:`event_capacity`, an upper bound of
the event count that the host knows from the sequence lengths and the configuration alone.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .config import SparseGDNConfig
from .selection import fixed_tier_counts, tier_table


@dataclass(frozen=True)
class EventCSR:
    """Selected events of every (sequence, pair), on the mask's device.

    Attributes:
        event_index: ``[N, P, Cmax + 1]`` int32, the CSR index of the row's first event at a chunk ``>= c``. So
            ``event_index[n, p, 0]`` and ``event_index[n, p, Cmax]`` delimit the row's events; a selected chunk c is
            event ``event_index[n, p, c]``; the last event before chunk c is ``event_index[n, p, c] − 1`` when that
            is ``>= event_index[n, p, 0]`` (else the row has no event before c).
        event_chunk: ``[capacity + 1]`` int32, the sequence-local chunk of each event (entries from E on are unused;
            the last one takes the scatter of the unselected chunks).
        capacity: an upper bound of the event count E (the buffers indexed by event have this many rows).
    """

    event_index: torch.Tensor
    event_chunk: torch.Tensor
    capacity: int


def event_capacity(lengths: list[int], pairs: int, config: SparseGDNConfig, any_mask: bool = False) -> int:
    """Upper bound of the selected events of one call, from the host-side lengths (plain integer arithmetic: it runs
    on the host before every csr call).

    The selector keeps exactly ``k_ℓ`` chunks of a pair of tier ℓ (anchors plus the best middle chunks), so a
    sequence has ``n_H k_H + n_M k_M + n_L k_L`` events, at most the largest of these over the tier table's entries
    (the fixed counts for ``"fixed_tiers"``, every chunk for ``"all"``). ``any_mask``: the mask does not come from the
    selector (a test holding it fixed): every chunk of every pair may be an event.
    """
    chunks = [-(-n // 64) for n in lengths]
    if any_mask or config.selection == "all":
        return pairs * sum(chunks)
    fixed = config.fixed_tiers if config.selection == "fixed_tiers" else None
    entries = _tier_entries(pairs, tuple(config.tier_ratios), fixed)
    total = 0
    for C in chunks:
        k_low, k_mid, k_high = (min(max(math.floor(r * C + 0.5), 2), C) for r in config.tier_ratios)  # tier_sizes
        total += max(h * k_high + m * k_mid + (pairs - h - m) * k_low for h, m in entries)
    return total


@functools.lru_cache(maxsize=64)
def _tier_entries(pairs: int, ratios: tuple[float, float, float], fixed_tiers) -> tuple[tuple[int, int], ...]:
    """The (n_H, n_M) splits the selector may choose for ``pairs`` pairs (the tier table's, or the fixed one)."""
    if fixed_tiers is not None:
        return (fixed_tier_counts(fixed_tiers, pairs, ratios),)
    return tuple((h, m) for h, mids in tier_table(pairs, ratios).items() for m in mids)


def build_event_csr(mask: torch.Tensor, capacity: int) -> EventCSR:
    """The CSR of ``mask [N, P, Cmax]`` (bool, False past each sequence's end) for at most ``capacity`` events.

    A mask with more events than ``capacity`` fails an asynchronous device assertion (no host synchronisation).
    """
    N, P, Cmax = mask.shape
    dev = mask.device
    selected = mask.to(torch.int32)
    before = torch.zeros(N, P, Cmax + 1, dtype=torch.int32, device=dev)
    before[..., 1:] = selected.cumsum(-1)
    row_end = before[..., -1].reshape(-1).cumsum(0)
    row_start = (row_end - before[..., -1].reshape(-1)).view(N, P, 1)
    event_index = (row_start + before).to(torch.int32)
    torch._assert_async(row_end[-1] <= capacity, "SparseGDN: more selected events than the event capacity")
    chunk = torch.arange(Cmax, dtype=torch.int32, device=dev).expand(N, P, Cmax)
    slot = torch.where(mask, event_index[..., :-1], capacity).to(torch.int64)
    event_chunk = torch.empty(capacity + 1, dtype=torch.int32, device=dev)
    event_chunk.scatter_(0, slot.reshape(-1), chunk.reshape(-1))
    return EventCSR(event_index=event_index, event_chunk=event_chunk, capacity=capacity)
