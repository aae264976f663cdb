"""Selection recall: how much of the dense attention mass the blocks a selector picks would keep.

For a query ``i`` of attention layer ``l`` and GQA group ``h`` with ``G`` query heads, the dense attention mass of
block ``b`` is ``m(b) = (1/G) Σ_g Σ_{t ∈ b, t ≤ i} softmax_t(q_{i,g} · k_t · d^-½)`` (the group's heads averaged, so
that a query's masses sum to 1). A selector returns a block list per (query, group) in the geometry of
:class:`~longsparse.ops.sparse_attn.SparseAttentionConfig` (init and local blocks forced, the rest of the budget
chosen by its scores, as ``naive.select_blocks_ref`` does). Two numbers per selector:

* ``recall``: mass of the chosen blocks that are neither init nor local over the mass of all such blocks — what the
  selector itself decides, since every selector gets the forced blocks for free;
* ``recall_with_forced``: mass of all selected blocks (forced included) over the total mass (1 per query).

Both are ratios of sums over queries, groups and sequences (mass-weighted), computed per layer and then averaged
over layers. ``oracle`` picks the blocks of largest mass: the best any selector can do within the budget.

Selectors: ``infllmv2`` (the layer's own queries on (32, 16) compressed keys, summed per-head softmax), and Forecast
projections (``f`` of the previous attention layer — or the first layer's current forecast — on the layer's
compressed keys).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models.base import CausalLM
from ..models.capture import capture_attention
from ..models.forecast import ForecastProjections, forecast_source, forecast_states
from ..ops.sparse_attn.config import SparseAttentionConfig
from ..ops.sparse_attn.naive import (
    compress_keys_ref,
    forced_blocks,
    forecast_scores_ref,
    infllmv2_scores_ref,
    pool_blocks_ref,
    select_blocks_ref,
)

Selector = Callable[..., torch.Tensor]
"""``select(target, captures, positions [P], cos, sin, mass [Hkv, P, NB]) -> block scores [Hkv, P, NB]``: the block
scores of attention layer ``target`` from the captures of every attention layer (``mass`` only for the oracle)."""


def block_mass(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[Hkv, P, NB]`` dense causal attention mass per block, the group's heads averaged (rows sum to 1).

    ``q [P, Hq, d]`` at ``positions [P]``; ``k [T, Hkv, d]``; ``NB = ceil(T / block_size)``. Float32 (float64 for
    float64 input)."""
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    P, Hq, d = q.shape
    T, Hkv = k.shape[0], k.shape[1]
    qg = q.to(dt).view(P, Hkv, Hq // Hkv, d).permute(1, 2, 0, 3)
    logits = torch.matmul(qg * d**-0.5, k.to(dt).permute(1, 2, 0)[:, None])
    causal = torch.arange(T, device=q.device) <= positions[:, None]
    probs = torch.softmax(logits.masked_fill_(~causal, float("-inf")), dim=-1).mean(dim=1)
    NB = -(-T // block_size)
    probs = torch.nn.functional.pad(probs, (0, NB * block_size - T))
    return probs.view(Hkv, P, NB, block_size).sum(-1)


def selected_mask(block_scores: torch.Tensor, positions: torch.Tensor, config: SparseAttentionConfig) -> torch.Tensor:
    """``[Hkv, P, NB]`` bool: the blocks ``naive.select_blocks_ref`` picks from ``block_scores [Hkv, P, NB]``."""
    Hkv, P, NB = block_scores.shape
    idx = select_blocks_ref(block_scores[None], positions[None], config)[0]  # [P, Hkv, S]
    hit = torch.zeros(P, Hkv, NB + 1, dtype=torch.bool, device=block_scores.device)
    hit.scatter_(-1, torch.where(idx < 0, NB, idx.long()), True)
    return hit[..., :NB].permute(1, 0, 2)


def infllmv2_selector(config: SparseAttentionConfig) -> Selector:
    """InfLLM-V2's stage-1 scores of the layer's own queries, max-pooled onto blocks."""

    def select(target, captures, positions, cos, sin, mass):
        cap = captures[target]
        k_cmp, _ = compress_keys_ref(cap.k[None], config.kernel_size, config.kernel_stride, summary=config.key_summary)
        scale = cap.q.shape[-1] ** -0.5
        scores = infllmv2_scores_ref(cap.q[None], k_cmp, positions[None], config, scale)[0]
        return pool_blocks_ref(scores, mass.shape[-1], config)

    return select


def forecast_selector(
    projections: ForecastProjections, config: SparseAttentionConfig, attention_layers: Sequence[int]
) -> Selector:
    """Forecast logits (previous attention layer's projection, or the first layer's current one, as ``sparda``
    attention computes them: :func:`~longsparse.models.forecast.forecast_states`), pooled onto blocks.
    ``attention_layers``: the model's."""

    def select(target, captures, positions, cos, sin, mass):
        cap, src = captures[target], captures[forecast_source(attention_layers, target)]
        k_cmp, _ = compress_keys_ref(
            cap.k[None].float(), config.kernel_size, config.kernel_stride, summary=config.key_summary
        )
        with torch.no_grad():
            weight = projections.weight_for(target, attention_layers).float()
            f = forecast_states(weight, src.x.float(), cos, sin, projections.num_kv_heads)
        scores = forecast_scores_ref(f[None], k_cmp, positions[None], config)[0]
        return pool_blocks_ref(scores, mass.shape[-1], config)

    return select


def oracle_selector(target, captures, positions, cos, sin, mass) -> torch.Tensor:
    """The dense attention mass itself: the best selection within the budget."""
    return mass


@dataclass
class RecallTally:
    """Sums over queries of one (length, layer, selector): chosen non-forced mass, all non-forced mass, selected
    mass (forced included) and total mass; and over the queries with non-forced mass, how many of them chose the
    non-forced block of largest mass (``top_hits`` of ``top_rows``)."""

    chosen: float = 0.0
    free: float = 0.0
    selected: float = 0.0
    total: float = 0.0
    top_hits: int = 0
    top_rows: int = 0

    def add(self, mass: torch.Tensor, selected: torch.Tensor, forced: torch.Tensor) -> None:
        """``mass``, ``selected``, ``forced``: ``[..., NB]``, one row per (query, group)."""
        free = mass.masked_fill(forced, 0.0)
        self.chosen += float(free.masked_fill(~selected, 0.0).sum())
        self.free += float(free.sum())
        self.selected += float(mass.masked_fill(~selected, 0.0).sum())
        self.total += float(mass.sum())
        has_free = free.amax(dim=-1) > 0
        top = free.argmax(dim=-1, keepdim=True)
        self.top_hits += int((selected.gather(-1, top)[..., 0] & has_free).sum())
        self.top_rows += int(has_free.sum())

    def merge(self, other: RecallTally) -> None:
        """Add ``other``'s sums (the same tally over more queries)."""
        for name in ("chosen", "free", "selected", "total", "top_hits", "top_rows"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def top_block_hit(self) -> float:
        return self.top_hits / self.top_rows if self.top_rows else float("nan")

    @property
    def recall(self) -> float:
        return self.chosen / self.free if self.free > 0 else float("nan")

    @property
    def recall_with_forced(self) -> float:
        return self.selected / self.total if self.total > 0 else float("nan")


def query_positions(seq_len: int, count: int, tail: float, rng: np.random.Generator) -> torch.Tensor:
    """``count`` distinct positions drawn uniformly from the last ``tail`` fraction of a sequence, ascending."""
    if not 0 < tail <= 1:
        raise ValueError(f"tail must be in (0, 1], got {tail}")
    first = seq_len - max(1, int(seq_len * tail))
    span = seq_len - first
    idx = np.sort(rng.choice(span, size=min(count, span), replace=False))
    return torch.from_numpy(first + idx).to(torch.int64)


def selection_recall(
    model: CausalLM,
    sequences: list[torch.Tensor],
    positions: list[torch.Tensor],
    selectors: Mapping[str, Selector],
    config: SparseAttentionConfig,
) -> dict[tuple[int, str], RecallTally]:
    """Tallies per ``(attention layer, selector name)`` over ``sequences`` (each ``[T]`` token ids) at their query
    ``positions`` (each ``[P]``); the model runs each sequence once and every selector sees the same captures."""
    tallies: dict[tuple[int, str], RecallTally] = {}
    device = model.lm_head.weight.device
    for ids, pos in zip(sequences, positions):
        captures = capture_attention(model, ids, pos)
        pos = pos.to(device)
        cos, sin = model.rotary(pos)
        for target in model.config.attention_layers:
            cap = captures[target]
            mass = block_mass(cap.q, cap.k, pos, config.block_size)
            forced = forced_blocks(pos, mass.shape[-1], config)[None].expand_as(mass)
            for name, select in selectors.items():
                scores = select(target, captures, pos, cos, sin, mass)
                sel = selected_mask(scores, pos, config)
                tallies.setdefault((target, name), RecallTally()).add(mass, sel, forced)
    return tallies


@dataclass(frozen=True)
class RecallSetup:
    """What ``longsparse eval recall`` measures: ``sequences`` windows of each length in ``lengths`` drawn from the
    token stream, ``positions`` query positions per window from its last ``tail`` fraction, all from ``seed``."""

    lengths: tuple[int, ...] = (4096, 8192)
    sequences: int = 2
    positions: int = 128
    tail: float = 0.25
    seed: int = 0

    def __post_init__(self):
        if not self.lengths or any(not isinstance(n, int) or n <= 0 for n in self.lengths):
            raise ValueError(f"lengths must be positive ints, got {self.lengths!r}")
        for name in ("sequences", "positions"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not 0 < self.tail <= 1:
            raise ValueError(f"tail must be in (0, 1], got {self.tail}")


def recall_rows(tallies: Mapping[tuple[int, str], RecallTally], length: int) -> list[dict]:
    """One row per (layer, selector) of one length."""
    return [
        {
            "length": length,
            "layer": layer,
            "selector": name,
            "recall": t.recall,
            "recall_with_forced": t.recall_with_forced,
            "free_mass": t.free / t.total if t.total > 0 else float("nan"),
        }
        for (layer, name), t in sorted(tallies.items())
    ]


def summarize(rows: list[dict], names: list[str]) -> dict:
    """``recall_<name>`` and ``recall_<name>_with_forced`` (mean over lengths and layers), the same per length
    (``recall_<name>_<length>``), and ``free_mass``: the share of the dense mass outside init and local blocks."""
    summary: dict = {}
    lengths = sorted({r["length"] for r in rows})
    for name in names:
        mine = [r for r in rows if r["selector"] == name]
        for key in ("recall", "recall_with_forced"):
            suffix = "" if key == "recall" else "_with_forced"
            summary[f"recall_{name}{suffix}"] = float(np.mean([r[key] for r in mine]))
            for n in lengths:
                summary[f"recall_{name}{suffix}_{n}"] = float(np.mean([r[key] for r in mine if r["length"] == n]))
    if names:
        summary["free_mass"] = float(np.mean([r["free_mass"] for r in rows if r["selector"] == names[0]]))
    return summary
