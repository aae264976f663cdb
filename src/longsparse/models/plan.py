"""The plan of one step (FlashInfer's plan/run split): what is prepared once before the layers run and read by them,
what a layer hands to a later layer of the same step, and the statistics the step reports.

:meth:`CausalLM.plan_step <longsparse.models.base.CausalLM.plan_step>` builds a :class:`StepPlan` from the step's
:class:`~longsparse.models.batch.ForwardBatch`; the engine's runner and decode steppers call it once per step (a
CUDA-graph stepper once per capture: everything the plan holds stays where the graph recorded it across replays) and
pass the plan to the model, whose layers read it. The batch says what the step is and is never written to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..ops.gdn.launch import LaunchPlan


@dataclass
class BlockFractions:
    """Attended share of the causal KV blocks, summed over rows (one row = a query token × KV head × block-sparse
    layer): ``total`` is the sum of each row's ``attended blocks / causal blocks`` (a device tensor, so that adding
    to it needs no host sync), ``rows`` the row count. A row that falls back to dense attention counts 1."""

    total: torch.Tensor | float = 0.0
    rows: int = 0

    def add(self, total: torch.Tensor | float, rows: int) -> None:
        self.total = self.total + total
        self.rows += rows

    def merge(self, other: BlockFractions) -> None:
        self.add(other.total, other.rows)

    def mean(self) -> float | None:
        """The mean fraction over the rows added so far (reads the device once), None if there were none."""
        return float(self.total) / self.rows if self.rows else None


@dataclass
class StepStats:
    """What the layers of a step report.

    Attributes:
        gdn_keep_ratios: one entry per sparse GDN layer that ran (fraction of recurrence events kept), as 0-dim device
            tensors so that no layer waits for the device; :meth:`keep_ratio_values` reads them once.
        block_fractions: share of the KV blocks the block-sparse attention layers attended.
    """

    gdn_keep_ratios: list[torch.Tensor | float] = field(default_factory=list)
    block_fractions: BlockFractions = field(default_factory=BlockFractions)

    def keep_ratio_values(self) -> list[float]:
        """:attr:`gdn_keep_ratios` as floats, read from the device at once."""
        tensors = [k.double() for k in self.gdn_keep_ratios if isinstance(k, torch.Tensor)]
        read = iter(torch.stack(tensors).tolist() if tensors else ())
        return [next(read) if isinstance(k, torch.Tensor) else float(k) for k in self.gdn_keep_ratios]


@dataclass
class ForecastHandoffs:
    """SparDA's forecasts on their way from the attention layer that computes them to the layer they choose blocks for
    (:class:`~longsparse.models.sparse_attention.ForecastEmitter` puts, the target's
    :class:`~longsparse.models.sparse_attention.SpardaAttention` takes and drops), keyed by the target layer.

    Attributes:
        states: prefill, ``F [T, Hkv, D]`` of the step's tokens (as large as the layer's keys: dropped once spent).
        blocks: decode, the chosen blocks ``[N, Hkv, W]`` (already announced to the KV cache's prefetch).
    """

    states: dict[int, torch.Tensor] = field(default_factory=dict)
    blocks: dict[int, torch.Tensor] = field(default_factory=dict)

    def drop(self, target: int) -> None:
        self.states.pop(target, None)
        self.blocks.pop(target, None)


@dataclass
class StepPlan:
    """One step's plan (see the module docstring).

    Attributes:
        gdn_launch: prefill, the SparseGDN launch plan of the step's sequences that every sparse GDN layer running the
            GPU kernels shares (None: none runs them, or each call plans its own).
        dense_decode_blocks: decode, ``[N, Hkv, ceil(max_seqlen / DECODE_BLOCK)]`` int32, every block number: the
            table dense attention's split-KV kernel reads in every dense layer (None where no dense layer runs it).
        topk_counters: decode, the zeroed row counters every decode block selection of the step shares (the
            compressed-key store's, kept across steps and graph replays; None without block-sparse layers).
        forecasts: the Forecast hand-offs between attention layers.
        stats: what the layers report; the step returns it.
    """

    gdn_launch: LaunchPlan | None = None
    dense_decode_blocks: torch.Tensor | None = None
    topk_counters: torch.Tensor | None = None
    forecasts: ForecastHandoffs = field(default_factory=ForecastHandoffs)
    stats: StepStats = field(default_factory=StepStats)
