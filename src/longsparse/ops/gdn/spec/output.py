"""Output reconstruction from the sparse states, for every token (SparseGDN (Zhuang et al., arXiv:2610.41420)
Sec. 2.7, Eqs. 22–25).

Grouped (span 2): chunks (c, c+1) = (2r, 2r+1) of a sequence share the group-entry state S_c;

* ``O_c     = scale · [e^{G_c} ⊙ (Q_c S_c) + A_c,c U'_c]``
* ``O_c+1   = scale · [e^{G_c+1 + γ_c} ⊙ (Q_c+1 S_c) + A_c+1,c U'_c + A_c+1,c+1 U'_c+1]``,
  ``A_c+1,c[i, j] = ⟨Q_c+1[i], K_c[j]⟩ e^{G_c+1,i + γ_c − G_c,j}`` (no mask: all of c precedes c+1).

The neighbour term A_c+1,c U'_c is kept whether or not chunk c was selected; when it was not, it is the only path by
which chunk c reaches chunk c+1's output. A lone last even chunk is a group of one.

Per chunk (span 1): every chunk reads its own sparse entering state, ``O_c = scale · [e^{G_c} ⊙ (Q_c S_c) +
A_c,c U'_c]``. The two differ exactly by ``(1 − z_c) · scale · A_c+1,c U'_c`` on odd chunks (Eq. 25).
"""

from __future__ import annotations

import torch

from ..layout import ChunkLayout
from ..naive import causal_decay
from .events import EventLayout
from .recur import RecurrenceResult


def entry_states(
    layout: ChunkLayout,
    events: EventLayout,
    recurrence: RecurrenceResult,
    gamma: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> torch.Tensor:
    """``[HV, NC, K, V]``: for every chunk, the state at the entry of its output group (``events.span``), recovered
    from the group's predecessor snapshot by the decay prefix, or from the initial state (zeros if None).

    gamma: ``[HV, NC]`` chunk total log decays.
    """
    snaps = recurrence.snapshots
    HV = gamma.shape[0]
    K, V = recurrence.final_state.shape[-2:]
    dtype, dev = recurrence.U_new.dtype, gamma.device
    heads = torch.arange(HV, device=dev)[:, None]
    seq = layout.chunk_seq[None, :]
    group_idx = layout.chunk_pos // events.span
    entry = (layout.seq_chunk_offsets[layout.chunk_seq] + events.span * group_idx)[None, :]
    pred = events.group_pred[seq, heads // events.group, group_idx[None, :]]  # [HV, NC]
    has_pred = pred >= 0
    pred = pred.clamp(min=0)
    pred_chunk = events.event_chunk[pred] if events.E else torch.zeros_like(pred)
    gap = events.decay_prefix[heads, entry] - torch.where(
        has_pred, events.decay_prefix[heads, pred_chunk] + gamma.to(torch.float64)[heads, pred_chunk], 0.0
    )
    if events.E:
        slot = events.event_snapshot[pred]
        from_event = snaps[slot.clamp(min=0), heads % events.group]
    else:
        from_event = recurrence.U_new.new_zeros(HV, layout.NC, K, V)
    if initial_state is None:
        from_start = torch.zeros_like(from_event)
    else:
        from_start = initial_state.to(dtype)[seq, heads]
    base = torch.where(has_pred[..., None, None], from_event, from_start)
    return base * gap.exp().to(dtype)[..., None, None]


def _local_output(q, k, G, S_entry, U_new, entry_shift, scale):
    """``scale · [e^{G + shift} ⊙ (Q S_entry) + (Q Kᵀ ⊙ e^{G_i − G_j} ⊙ [j ≤ i]) U']`` per chunk."""
    inter = (G + entry_shift[..., None]).exp()[..., None] * (q @ S_entry)
    intra = ((q @ k.transpose(-1, -2)) * causal_decay(G, G, strict=False)) @ U_new
    return scale * (inter + intra)


def neighbour_term(q, k, G, U_new, second: torch.Tensor) -> torch.Tensor:
    """``A_c+1,c U'_c`` for the packed chunks ``second [M]`` (each the later chunk c+1 of a group), ``[HV, M, 64, V]``;
    q, k ``[HV, NC, 64, K]``, G ``[HV, NC, 64]``, U_new ``[HV, NC, 64, V]``."""
    first = second - 1
    Gs, Gf = G[:, second], G[:, first]
    decay = (Gs[..., :, None] + Gf[..., -1:, None] - Gf[..., None, :]).exp()
    return ((q[:, second] @ k[:, first].transpose(-1, -2)) * decay) @ U_new[:, first]


def grouped_output(q, k, G, U_new, S_entry, layout: ChunkLayout, scale: float) -> torch.Tensor:
    """Two-chunk grouped output ``[HV, NC, 64, V]`` (Eqs. 22–24); ``S_entry`` from :func:`entry_states` with span 2."""
    second = (layout.chunk_pos % 2 == 1).nonzero(as_tuple=True)[0]
    shift = torch.zeros_like(G[..., -1])
    shift[:, second] = G[:, second - 1, -1]
    out = _local_output(q, k, G, S_entry, U_new, shift, scale)
    out[:, second] += scale * neighbour_term(q, k, G, U_new, second)
    return out


def per_chunk_output(q, k, G, U_new, S_entry, scale: float) -> torch.Tensor:
    """Per-chunk output ``[HV, NC, 64, V]``; ``S_entry`` from :func:`entry_states` with span 1 (each chunk's own
    sparse entering state)."""
    return _local_output(q, k, G, S_entry, U_new, torch.zeros_like(G[..., -1]), scale)
