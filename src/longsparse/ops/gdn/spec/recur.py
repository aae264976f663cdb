"""Event-sparse recurrence over the CSR (SparseGDN (Zhuang et al., arXiv:2610.41420) Sec. 2.6, Eqs. 17–21).

Per row (sequence, pair), walking its events in time order, with S the state after the previous event (or the
initial state before chunk 0, prefix 0):

* bridge the skipped chunks: ``S_c = e^{P_c − P_{e+1}} S_{e+1}`` (Eq. 20; P_{e+1} = P_e + γ_e, 0 at the start);
* selected event c: ``U'_c = U_c − W_c S_c``, ``S_{c+1} = e^{γ_c} S_c + K_cᵀ (U'_c ⊙ e^{γ_c − G_c})``.

Skipped chunks keep ``U' = U`` and only decay the state (Eqs. 17–18), which the bridge does in one step.
The rows are independent; this specification runs the j-th event of every row together (a loop over event steps,
vectorised over rows), as a kernel with one program per row does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..naive import state_step
from .events import EventLayout
from .intra import IntraResult


@dataclass(frozen=True)
class RecurrenceResult:
    """What the recurrence leaves for the output stage and for decoding.

    Attributes:
        U_new: ``[HV, NC, 64, V]`` U', equal to U except at selected events, where it is U − W S.
        snapshots: ``[NS, group, K, V]`` the state after event e, at slot ``events.event_snapshot[e]``, for the
            heads of the event's pair in order.
        final_state: ``[N, HV, K, V]`` S_C of every sequence: ``e^{P_C − P_{e_last+1}} S_{e_last+1}``, or
            ``e^{P_C} S_0`` for a pair without events.
    """

    U_new: torch.Tensor
    snapshots: torch.Tensor
    final_state: torch.Tensor


def sparse_recurrence(
    k: torch.Tensor,
    G: torch.Tensor,
    intra: IntraResult,
    events: EventLayout,
    initial_state: torch.Tensor | None,
) -> RecurrenceResult:
    """Run the event-sparse recurrence.

    Args:
        k: ``[HV, NC, 64, K]`` packed keys (qk heads expanded). G: ``[HV, NC, 64]`` chunk-local cumulative log decay.
        intra: U and the deferred-W coefficients. events: the CSR.
        initial_state: ``[N, HV, K, V]`` or None (zeros), the state before each sequence's chunk 0.
    """
    HV, _, _, K = k.shape
    U = intra.U
    V = U.shape[-1]
    dtype, dev = U.dtype, U.device
    gamma = G[..., -1].to(torch.float64)
    heads_of_row = events.row_heads()  # [R, group]
    R = heads_of_row.shape[0]
    seq_of_row = events.row_seq[:, None]
    if initial_state is None:
        S = U.new_zeros(R, events.group, K, V)
    else:
        S = initial_state.to(dtype)[seq_of_row, heads_of_row]
    after_prefix = torch.zeros(R, events.group, dtype=torch.float64, device=dev)
    W = intra.w(k, events.event_heads(), events.event_chunk[:, None])  # [E, group, 64, K]
    U_new = U.clone()
    snapshots = U.new_empty(events.num_snapshots, events.group, K, V)
    row_len = events.row_len
    for j in range(int(row_len.max()) if R else 0):
        rows = (row_len > j).nonzero(as_tuple=True)[0]
        e = events.row_ptr[rows] + j
        heads, c = heads_of_row[rows], events.event_chunk[e][:, None]
        entry_prefix = events.decay_prefix[heads, c]
        S_c = S[rows] * (entry_prefix - after_prefix[rows]).exp().to(dtype)[..., None, None]
        u_new = U[heads, c] - W[e] @ S_c
        U_new[heads, c] = u_new
        S_next = state_step(S_c, k[heads, c], G[heads, c], u_new)
        S[rows] = S_next
        after_prefix[rows] = entry_prefix + gamma[heads, c]
        slot = events.event_snapshot[e]
        kept = slot >= 0
        snapshots[slot[kept]] = S_next[kept]
    tail = (events.decay_total[heads_of_row, seq_of_row] - after_prefix).exp().to(dtype)
    final_state = U.new_empty(events.N, HV, K, V)
    final_state[seq_of_row, heads_of_row] = S * tail[..., None, None]
    return RecurrenceResult(U_new=U_new, snapshots=snapshots, final_state=final_state)
