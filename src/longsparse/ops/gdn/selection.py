"""What the event selection produces and the tier arithmetic that sizes it (SparseGDN (Zhuang et al., arXiv:2610.41420)
Sec. 2.4.3): shared by the specification's selector (``spec/select.py``) and the GPU path (``select.py``, ``csr.py``,
``launch.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from .config import REFERENCE_PAIRS

PAPER_TIER_TABLE = {1: (11, 12, 13), 2: (7, 8, 9), 3: (3, 4, 5), 4: (0,)}
"""The paper's table for 16 pairs (Sec. 2.4.3): n_H -> candidate n_M."""


@dataclass(frozen=True)
class Selection:
    """The event mask and everything it was chosen from (float fields in the compute dtype).

    Attributes:
        mask: ``[N, P, Cmax]`` bool, True where (sequence, pair, chunk) is a selected event; False past C_n.
        tier: ``[N, P]`` int64, 0 low / 1 mid / 2 high.
        tier_k: ``[N, 3]`` int64, chunks kept by a low / mid / high pair (k_ℓ, Eq. 13).
        n_high, n_mid: ``[N]`` int64, pairs in the high and mid tiers.
        rank_score: ``[N, P, Cmax]`` q_c, the per-pair chunk ranking score (Eq. 10), 0 past C_n.
        lifetime: ``[N, HV]`` L_h. visibility: ``[N, HV]`` G_h (1 when visibility is off or there is no gate).
        gain_mid, gain_high: ``[N, P]`` x_M, x_H, the upgrade gains Δ_L→M, Δ_M→H divided by their mean over pairs.
    """

    mask: torch.Tensor
    tier: torch.Tensor
    tier_k: torch.Tensor
    n_high: torch.Tensor
    n_mid: torch.Tensor
    rank_score: torch.Tensor
    lifetime: torch.Tensor
    visibility: torch.Tensor
    gain_mid: torch.Tensor
    gain_high: torch.Tensor


def round_half_up(x: torch.Tensor) -> torch.Tensor:
    """``floor(x + 0.5)``: the rounding of k_ℓ = round(ρ C) (halves round up, unlike torch.round)."""
    return torch.floor(x + 0.5)


def tier_sizes(chunks: torch.Tensor, ratios: tuple[float, float, float]) -> torch.Tensor:
    """``[N] -> [N, 3]`` k_ℓ = clip(round(ρ_ℓ C), 2, C) for (low, mid, high), computed in float64; C = 1 gives 1
    (the upper bound wins) and C = 0 gives 0."""
    rho = torch.tensor(ratios, dtype=torch.float64, device=chunks.device)
    C = chunks.to(torch.float64)[:, None]
    return torch.minimum(round_half_up(rho * C).clamp(min=2), C).to(torch.int64)


def _budget_scaled(n_high16: int, n_mid16: int, pairs: int, ratios: tuple[float, float, float]) -> tuple[int, int]:
    """Map a (n_H, n_M) entry for 16 pairs to ``pairs`` pairs, keeping its budget above all-low.

    With a = (ρ_H − ρ_L)/(ρ_M − ρ_L) (one high pair costs a mid pairs) and f = pairs / 16, the entry's budget in mid
    pair units is f (a n_H + n_M). The high count scales as round(f n_H) but never beyond what the budget pays for
    alone; the rest of the budget buys mid pairs. Exact rational arithmetic, so 16 pairs give the entry back.
    """
    lo, mid, high = (Fraction(r) for r in ratios)
    a = (high - lo) / (mid - lo)
    f = Fraction(pairs, REFERENCE_PAIRS)
    half = Fraction(1, 2)
    n_high = min(math.floor(f * n_high16 + half), math.floor(f * (n_high16 + n_mid16 / a)))
    n_mid = math.floor(f * (a * n_high16 + n_mid16) - a * n_high + half)
    return n_high, min(max(n_mid, 0), pairs - n_high)


def tier_table(pairs: int, ratios: tuple[float, float, float]) -> dict[int, tuple[int, ...]]:
    """n_H -> candidate n_M for ``pairs`` pairs: the paper's table (Sec. 2.4.3) for 16 pairs, otherwise every entry
    scaled by :func:`_budget_scaled` (entries that land on the same n_H merge their n_M candidates)."""
    table: dict[int, set[int]] = {}
    for n_high16, mids in PAPER_TIER_TABLE.items():
        for n_mid16 in mids:
            n_high, n_mid = _budget_scaled(n_high16, n_mid16, pairs, ratios)
            table.setdefault(n_high, set()).add(n_mid)
    return {h: tuple(sorted(table[h])) for h in sorted(table)}


def fixed_tier_counts(fixed_tiers: tuple[int, int, int], pairs: int, ratios) -> tuple[int, int]:
    """(n_H, n_M) of the ``"fixed_tiers"`` ablation: ``fixed_tiers = (n_L, n_M, n_H)`` for 16 pairs, scaled like
    the table."""
    return _budget_scaled(fixed_tiers[2], fixed_tiers[1], pairs, ratios)
