"""The whole SparseGDN forward as a chain of the specification's stages, keeping every intermediate.

``run_spec`` is what the public op runs on the torch backend, and what a kernel port compares against stage by stage
(intra → selection → events → recurrence → output), optionally on a given event mask.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import SparseGDNConfig
from ..heads import HeadSplit
from ..layout import ChunkLayout, build_layout
from .events import EventLayout, build_events
from .intra import IntraResult, block_adjacent_solve, full_solve
from .output import entry_states, grouped_output, per_chunk_output
from .recur import RecurrenceResult, sparse_recurrence
from .select import Selection, select_events


@dataclass(frozen=True)
class PackedInputs:
    """Packed ``[HV, NC, 64, *]`` inputs: q, k (expanded to the value heads), v, beta, and G the chunk-local
    inclusive cumulative log decay; gamma ``[HV, NC]`` = G[..., -1], the chunk total log decay."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    beta: torch.Tensor
    G: torch.Tensor
    gamma: torch.Tensor


@dataclass(frozen=True)
class SpecTrace:
    """Every stage's result of one forward. ``output``: ``[HV, NC, 64, V]`` packed; ``o``: ``[B, T, HV, V]``,
    both in the compute dtype. With a head split, ``selection`` is every pair's of the layer and the later stages
    hold this call's pairs."""

    layout: ChunkLayout
    inputs: PackedInputs
    intra: IntraResult
    selection: Selection
    events: EventLayout
    recurrence: RecurrenceResult
    entry_states: torch.Tensor
    output: torch.Tensor
    o: torch.Tensor


def pack_inputs(layout: ChunkLayout, q, k, v, g, beta) -> PackedInputs:
    """Pack ``[B, T, HV, *]`` inputs (q, k already expanded to HV heads) into chunks."""
    G = layout.pack(g).cumsum(-1)
    return PackedInputs(
        q=layout.pack(q), k=layout.pack(k), v=layout.pack(v), beta=layout.pack(beta), G=G, gamma=G[..., -1]
    )


def run_spec(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    group: int,
    scale: float,
    config: SparseGDNConfig,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    gate_norm_weight: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    heads: HeadSplit | None = None,
) -> SpecTrace:
    """Run every stage on validated inputs already in the compute dtype.

    Args:
        q, k: ``[B, T, HV, K]`` (qk heads expanded to the value heads; L2-normalised if asked). v: ``[B, T, HV, V]``.
        g, beta: ``[B, T, HV]`` natural-log decay and update strength. group: value heads per qk head (HV / H).
        scale: the output scale, the 1/√d of SparseGDN (Zhuang et al., arXiv:2610.41420). config: the SparseGDN
            configuration.
        initial_state: ``[N, HV, K, V]`` or None. cu_seqlens: ``[N + 1]`` or None.
        gate, gate_norm_weight: ``[B, T, HV, V]`` and ``[V]`` for the visibility factor, or None.
        mask: ``[N, P, Cmax]`` bool to use instead of the selected mask (the tiers still come from the selector);
            a kernel port uses it to compare later stages on one mask.
        heads: the inputs hold these heads of the layer (:class:`~longsparse.ops.gdn.heads.HeadSplit`): the selection
            is taken over every head (see there), the events are this call's pairs'.
    """
    B, T = q.shape[:2]
    layout = build_layout(B, T, cu_seqlens, q.device)
    x = pack_inputs(layout, q, k, v, g, beta)
    solve = full_solve if config.solve == "full" else block_adjacent_solve
    intra = solve(x.k, x.v, x.beta, x.G, config.tail)
    selection = select_events(layout, intra.score, x.gamma, group, config, gate, gate_norm_weight, heads)
    if mask is not None:
        if mask.shape != selection.mask.shape or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor of shape {list(selection.mask.shape)}, got {mask.shape}")
        selection = dataclasses.replace(selection, mask=mask & layout.grid_valid[:, None, :])
    own_mask, own_tier = selection.mask, selection.tier
    if heads is not None:
        own_mask, own_tier = heads.own_pairs(own_mask, group), heads.own_pairs(own_tier, group)
    span = 2 if config.output == "grouped" else 1
    events = build_events(layout, own_mask, own_tier, x.gamma, group, span)
    recurrence = sparse_recurrence(x.k, x.G, intra, events, initial_state)
    S_entry = entry_states(layout, events, recurrence, x.gamma, initial_state)
    if config.output == "grouped":
        out = grouped_output(x.q, x.k, x.G, recurrence.U_new, S_entry, layout, scale)
    else:
        out = per_chunk_output(x.q, x.k, x.G, recurrence.U_new, S_entry, scale)
    return SpecTrace(
        layout=layout,
        inputs=x,
        intra=intra,
        selection=selection,
        events=events,
        recurrence=recurrence,
        entry_states=S_entry,
        output=out,
        o=layout.unpack(out),
    )
