"""SparseGDN spec, output: grouped and per-chunk output differ by exactly the neighbour term
(1 − z_c)·scale·A_c+1,c U'_c (SparseGDN (Zhuang et al., arXiv:2610.41420) Eq. 25) and by nothing where z_c = 1."""

import pytest
import torch

from longsparse.ops.gdn import SparseGDNConfig
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gdn_inputs, spec_trace


def neighbour(trace, c):
    """scale · A_c+1,c U'_c for packed chunk c, written out from the definition."""
    x = trace.inputs
    scale = x.q.shape[-1] ** -0.5
    exponent = x.G[:, c + 1, :, None] + x.gamma[:, c, None, None] - x.G[:, c, None, :]
    A = (x.q[:, c + 1] @ x.k[:, c].transpose(-1, -2)) * exponent.exp()
    return scale * A @ trace.recurrence.U_new[:, c]


def both_outputs(T, H, HV, mask_fn, cu=None):
    N = len(cu) - 1 if cu else 1
    q, k, v, g, beta, h0 = make_gdn_inputs(1, T, H, HV, 8, 8, with_state=True, n_states=N, seed=3)
    cu = None if cu is None else torch.tensor(cu)
    grouped = spec_trace(q, k, v, g, beta, SparseGDNConfig(output="grouped"), h0, cu)
    mask = mask_fn(grouped.selection.mask.clone())
    grouped = spec_trace(q, k, v, g, beta, SparseGDNConfig(output="grouped"), h0, cu, mask=mask)
    per_chunk = spec_trace(q, k, v, g, beta, SparseGDNConfig(output="per_chunk"), h0, cu, mask=mask)
    return grouped, per_chunk


def skip_even_middle(mask):
    mask[..., 2:-1:2] = False
    return mask


def paper_example(mask):  # skip chunk 4, keep chunk 5 (the paper's Sec. 2.7)
    mask[..., 4] = False
    mask[..., 5] = True
    return mask


@pytest.mark.parametrize(
    "T, H, HV, mask_fn, cu",
    [
        (64 * 9 + 17, 2, 4, skip_even_middle, None),  # C = 10: groups (0,1) .. (8,9)
        (64 * 8 + 1, 1, 2, paper_example, None),  # C = 9: a lone last even chunk 8
        (64 * 13, 3, 6, skip_even_middle, (0, 64 * 6 + 5, 64 * 13)),
    ],
    ids=["T593-skip-even", "T513-paper-example-lone-last", "T832-varlen-skip-even"],
)
def test_grouped_minus_per_chunk_is_the_neighbour_term(T, H, HV, mask_fn, cu):
    grouped, per_chunk = both_outputs(T, H, HV, mask_fn, cu)
    lay, mask, group = grouped.layout, grouped.selection.mask, grouped.events.group
    assert torch.equal(mask, per_chunk.selection.mask)
    diff = grouped.output - per_chunk.output
    skipped_even = 0
    for c in range(lay.NC):
        n, pos = int(lay.chunk_seq[c]), int(lay.chunk_pos[c])
        if pos % 2 == 0:  # first chunk of a group (or a lone last chunk): same entry state, same output
            assert diff[:, c].abs().max() <= 1e-13 * per_chunk.output[:, c].abs().max()
            continue
        z = mask[n, :, pos - 1].repeat_interleave(group)  # [HV] z of the group's first chunk c - 1
        term = neighbour(grouped, c - 1)
        for h in range(diff.shape[0]):
            if z[h]:
                assert diff[h, c].abs().max() <= 1e-12 * per_chunk.output[h, c].abs().max()
            else:
                skipped_even += 1
                assert rel_err(diff[h, c], term[h]) <= 1e-11
                assert term[h].abs().max() > 1e-6
    assert skipped_even > 0


def test_grouped_equals_per_chunk_when_every_event_is_kept():
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 64 * 5 + 9, 2, 4, 8, 8, with_state=True)
    cfg = dict(selection="all")
    grouped = spec_trace(q, k, v, g, beta, SparseGDNConfig(output="grouped", **cfg), h0)
    per_chunk = spec_trace(q, k, v, g, beta, SparseGDNConfig(output="per_chunk", **cfg), h0)
    assert rel_err(grouped.o, per_chunk.o) <= 1e-13
    assert rel_err(grouped.recurrence.final_state, per_chunk.recurrence.final_state) <= 1e-15


def test_group_entry_state_is_recovered_from_the_predecessor_snapshot():
    """The entry state of group r is the true sparse state entering chunk 2r (per-chunk entry states)."""
    grouped, per_chunk = both_outputs(64 * 11 + 3, 2, 4, skip_even_middle)
    lay = grouped.layout
    entries = (lay.chunk_pos % 2 == 0).nonzero().flatten()
    assert rel_err(grouped.entry_states[:, entries], per_chunk.entry_states[:, entries]) <= 1e-13
    seconds = entries[entries + 1 < lay.NC] + 1
    assert torch.equal(grouped.entry_states[:, seconds], grouped.entry_states[:, seconds - 1])
