"""SparseGDN spec, recurrence and CSR: skipped events only decay the state, prefix bridging equals stepping chunk by
chunk, and the CSR arrays mean what docs/sparsegdn.md says."""

import pytest
import torch

from longsparse.ops.gdn import SparseGDNConfig
from longsparse.ops.gdn.naive import state_step
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gdn_inputs, spec_trace


def stepwise_states(trace, h0):
    """Chunk-by-chunk reference on the trace's mask: selected chunks read and write, skipped ones only decay.

    Returns (S_in [HV, NC, K, V] the state entering every chunk, U' [HV, NC, 64, V], final [N, HV, K, V])."""
    x, lay, sel, ev = trace.inputs, trace.layout, trace.selection, trace.events
    HV, NC, _, K = x.k.shape
    V = x.v.shape[-1]
    group = ev.group
    S_in = torch.zeros(HV, NC, K, V, dtype=x.k.dtype)
    U_new = trace.intra.U.clone()
    finals = []
    for n in range(lay.N):
        S = torch.zeros(HV, K, V, dtype=x.k.dtype) if h0 is None else h0[n].clone()
        first = int(lay.seq_chunk_offsets[n])
        for pos in range(int(lay.chunks_per_seq[n])):
            c = first + pos
            S_in[:, c] = S
            for h in range(HV):
                if sel.mask[n, h // group, pos]:
                    W = trace.intra.w(x.k, torch.tensor([h]), torch.tensor([c]))[0]
                    U_new[h, c] = trace.intra.U[h, c] - W @ S[h]
                    S[h] = state_step(S[h], x.k[h, c], x.G[h, c], U_new[h, c])
                else:
                    S[h] = x.gamma[h, c].exp() * S[h]
        finals.append(S)
    return S_in, U_new, torch.stack(finals)


MASK_CASES = [
    # B, T, H, HV, cu_seqlens
    (2, 64 * 9 + 5, 2, 4, None),
    (1, 64 * 11 + 20, 3, 3, (0, 64 * 4 + 1, 64 * 4 + 1, 64 * 11 + 20)),
]


@pytest.mark.parametrize("output", ["grouped", "per_chunk"])
@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}" + "-varlen" * bool(c[4]))
def test_event_sparse_recurrence_equals_chunk_by_chunk(case, output):
    B, T, H, HV, cu = case
    N = len(cu) - 1 if cu else B
    q, k, v, g, beta, h0 = make_gdn_inputs(B, T, H, HV, 8, 8, with_state=True, n_states=N)
    cfg = SparseGDNConfig(tier_ratios=(0.2, 0.4, 0.7), output=output)
    trace = spec_trace(q, k, v, g, beta, cfg, h0, None if cu is None else torch.tensor(cu))
    assert (~trace.selection.mask & trace.layout.grid_valid[:, None]).any(), "the case must skip some events"
    S_in, U_new, final = stepwise_states(trace, h0)
    assert rel_err(trace.recurrence.final_state, final) <= 1e-12
    assert rel_err(trace.recurrence.U_new, U_new) <= 1e-12
    if output == "per_chunk":  # span 1: every chunk's entry state is its own sparse entering state
        assert rel_err(trace.entry_states, S_in) <= 1e-12


def test_skipped_event_only_decays_the_state():
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 64 * 8, 2, 4, 8, 8, with_state=True)
    N, P, C = 1, 2, 8
    mask = torch.ones(N, P, C, dtype=torch.bool)
    mask[0, 1, 3] = False  # pair 1 (heads 2, 3) skips chunk 3
    mask[0, 0, 5:7] = False  # pair 0 skips chunks 5 and 6: a gap of two
    cfg = SparseGDNConfig(output="per_chunk")
    trace = spec_trace(q, k, v, g, beta, cfg, h0, mask=mask)
    S_in, gamma, U, U_new = trace.entry_states, trace.inputs.gamma, trace.intra.U, trace.recurrence.U_new
    for h, c in ((2, 3), (3, 3), (0, 5), (1, 6)):
        assert torch.equal(U_new[h, c], U[h, c])
        assert rel_err(S_in[h, c + 1], gamma[h, c].exp() * S_in[h, c]) <= 1e-14
    for h, c in ((0, 3), (2, 5)):  # selected events do change U and write
        assert rel_err(U_new[h, c], U[h, c]) > 1e-6
        assert rel_err(S_in[h, c + 1], gamma[h, c].exp() * S_in[h, c]) > 1e-6
    gap = trace.events.decay_prefix[0, 7] - trace.events.decay_prefix[0, 5]
    assert rel_err(S_in[0, 7], gap.exp() * S_in[0, 5]) <= 1e-14


def test_no_events_leaves_only_decay_of_the_initial_state():
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 64 * 3 + 7, 1, 2, 8, 8, with_state=True)
    trace = spec_trace(q, k, v, g, beta, initial_state=h0, mask=torch.zeros(1, 1, 4, dtype=torch.bool))
    assert trace.events.E == 0 and trace.events.num_snapshots == 0
    total = trace.inputs.gamma.sum(-1)  # [HV]
    assert rel_err(trace.recurrence.final_state[0], total.exp()[:, None, None] * h0[0]) <= 1e-14
    assert torch.equal(trace.recurrence.U_new, trace.intra.U)


def test_csr_arrays_follow_the_contract():
    cu = torch.tensor([0, 64 * 7 + 3, 64 * 7 + 3, 64 * 12])
    q, k, v, g, beta, _ = make_gdn_inputs(1, 64 * 12, 4, 8, 8, 8)
    trace = spec_trace(q, k, v, g, beta, SparseGDNConfig(tier_ratios=(0.1, 0.3, 0.8)), cu_seqlens=cu)
    lay, sel, ev = trace.layout, trace.selection, trace.events
    N, P, Cmax = sel.mask.shape
    assert (ev.row_ptr[1:] >= ev.row_ptr[:-1]).all() and int(ev.row_ptr[-1]) == ev.E == int(sel.mask.sum())
    for n in range(N):
        rows = list(range(n * P, (n + 1) * P))
        pairs = ev.row_pair[rows].tolist()
        assert sorted(pairs) == list(range(P))
        assert pairs == sorted(pairs, key=lambda p: (-int(sel.tier[n, p]), p)), "rows: high, mid, low; then pair"
        for r, p in zip(rows, pairs):
            assert int(ev.pair_row[n, p]) == r and int(ev.row_seq[r]) == n and int(ev.row_tier[r]) == sel.tier[n, p]
            chunks = ev.event_chunk[ev.row_ptr[r] : ev.row_ptr[r + 1]]
            pos = (chunks - lay.seq_chunk_offsets[n]).tolist()
            assert pos == sel.mask[n, p].nonzero().flatten().tolist(), "events of a row: its chunks in time order"
            assert (ev.event_row[ev.row_ptr[r] : ev.row_ptr[r + 1]] == r).all()
            for grp in range(ev.group_pred.shape[-1]):
                before = [i for i, c in enumerate(pos) if c < 2 * grp]
                exists = 2 * grp < int(lay.chunks_per_seq[n])
                want = int(ev.row_ptr[r]) + before[-1] if (before and exists) else -1
                assert int(ev.group_pred[n, p, grp]) == want
    needed = set(ev.group_pred[ev.group_pred >= 0].tolist())
    needed |= {int(ev.row_ptr[r + 1]) - 1 for r in range(N * P) if ev.row_ptr[r + 1] > ev.row_ptr[r]}
    kept = (ev.event_snapshot >= 0).nonzero().flatten().tolist()
    assert set(kept) == needed and ev.num_snapshots == len(needed) < ev.E
    assert ev.event_snapshot[kept].tolist() == list(range(len(kept)))
    gamma = trace.inputs.gamma
    for n in range(N):
        a, b = int(lay.seq_chunk_offsets[n]), int(lay.seq_chunk_offsets[n + 1])
        seq_gamma = gamma[:, a:b].double()
        want = torch.cat([torch.zeros(gamma.shape[0], 1, dtype=torch.float64), seq_gamma.cumsum(-1)[:, :-1]], -1)
        assert torch.allclose(ev.decay_prefix[:, a:b], want[:, : b - a], rtol=0, atol=1e-12)
        assert torch.allclose(ev.decay_total[:, n], seq_gamma.sum(-1), rtol=0, atol=1e-12)
    assert ev.decay_prefix.dtype == torch.float64
