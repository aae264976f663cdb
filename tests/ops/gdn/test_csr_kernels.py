"""The csr main pass (event CSR on the device, ``recur.py``, ``output.py``) against the walk main pass and the spec.

The CSR and its capacity are plain torch (checked against a brute-force reading of the contract). The kernels run in
Triton's interpreter on the CPU (fp32, small shapes) with the event mask held fixed: the csr pass must give the walk
pass's and the specification's output and final state. The ``gpu`` tests sit beside the walk pass's in
test_sparse_kernels.py (parametrised by main pass).
"""

import dataclasses

import pytest
import torch

from longsparse.ops._triton import kernels_can_run_on
from longsparse.ops.gdn import SparseGDNConfig, SparseGDNKernelConfig, naive_chunk_gated_delta_rule
from longsparse.ops.gdn.layout import build_layout
from longsparse.ops.gdn.spec.select import select_events
from tests.helpers import rel_err
from tests.ops.gdn.helpers import spec_trace
from tests.ops.gdn.test_sparse_kernels import DEV, _inputs, _to

launch = pytest.importorskip("longsparse.ops.gdn.launch", reason="needs triton")
csr = pytest.importorskip("longsparse.ops.gdn.csr", reason="needs triton")

needs_kernels = pytest.mark.skipif(
    not (kernels_can_run_on(torch.device("cpu")) or torch.cuda.is_available()),
    reason="Triton kernels cannot run here (no GPU and no interpreter)",
)


def _random_mask(lengths, P, density, seed):
    layout = build_layout(1, sum(lengths), torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]), "cpu")
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(layout.N, P, max(layout.Cmax, 1), generator=gen) < density
    return mask[..., : layout.Cmax] & layout.grid_valid[:, None, :], layout


@pytest.mark.parametrize("density", [0.0, 0.3, 1.0], ids=["none", "d0.3", "all"])
def test_event_csr_matches_brute_force(density):
    lengths = [64 * 9 + 5, 0, 64, 1, 64 * 4]
    mask, _ = _random_mask(lengths, P=3, density=density, seed=1)
    N, P, Cmax = mask.shape
    capacity = int(P * sum(-(-n // 64) for n in lengths))
    got = csr.build_event_csr(mask, capacity)
    events = [(n, p, c) for n in range(N) for p in range(P) for c in range(Cmax) if mask[n, p, c]]  # row-major
    assert got.event_chunk[: len(events)].tolist() == [c for _, _, c in events]
    for n in range(N):
        for p in range(P):
            for c in range(Cmax + 1):
                first_at_or_after = sum(1 for e in events if (e[0], e[1]) < (n, p) or (e[:2] == (n, p) and e[2] < c))
                assert got.event_index[n, p, c] == first_at_or_after, (n, p, c)
    assert got.event_index.dtype == torch.int32 and got.event_chunk.dtype == torch.int32


@pytest.mark.parametrize("selection", ["adaptive", "random", "all", "fixed_tiers"])
def test_event_capacity_bounds_every_selection(selection):
    """The host-side bound holds for the selector's masks (exact for "all" and "fixed_tiers"), for many inputs."""
    lengths = [64 * 70 + 3, 64 * 2, 0, 64 * 33, 40]
    P, group = 16, 2
    cfg = SparseGDNConfig(selection=selection)
    layout = build_layout(1, sum(lengths), torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()]), "cpu")
    cap = csr.event_capacity(lengths, P, cfg)
    assert csr.event_capacity(lengths, P, cfg, any_mask=True) == P * layout.NC
    counts = set()
    for seed in range(8):
        gen = torch.Generator().manual_seed(seed)
        score = torch.rand(P * group, layout.NC, generator=gen, dtype=torch.float64) ** 4
        gamma = -torch.rand(P * group, layout.NC, generator=gen, dtype=torch.float64)
        E = int(select_events(layout, score, gamma, group, cfg).mask.sum())
        assert E <= cap
        counts.add(E)
    if selection in ("all", "fixed_tiers"):
        assert counts == {cap}


def _spec_and_inputs(lengths, output, mask_kind, with_h0, seed=0):
    q, k, v, g, beta, h0, gate, w, cu = _inputs(lengths, seed=seed)
    h0 = h0 if with_h0 else None
    spec_cfg = SparseGDNConfig(output=output)
    trace = spec_trace(q, k, v, g, beta, spec_cfg, initial_state=h0, cu_seqlens=cu, gate=gate, weight=w)
    layout = trace.layout
    if mask_kind != "selector":
        P = trace.selection.mask.shape[1]
        valid = layout.grid_valid[:, None, :].expand(layout.N, P, layout.Cmax)
        if mask_kind == "all":
            mask = valid.clone()
        else:  # only the anchors: each sequence's first and last chunk
            pos = torch.arange(layout.Cmax)
            C = layout.chunks_per_seq[:, None, None]
            mask = valid & ((pos == 0) | (pos == C - 1))
        trace = spec_trace(q, k, v, g, beta, spec_cfg, initial_state=h0, cu_seqlens=cu, gate=gate, weight=w, mask=mask)
    return (q, k, v, g, beta, h0, gate, w, cu), trace


CASES = {
    # lengths, output, mask, initial state, segment_chunks, warmup_log_decay
    "varlen-selector-grouped-h0-one-segment": ([300, 7, 64, 131], "grouped", "selector", True, None, 12.0),
    "varlen-selector-per_chunk-seg2-exact": ([300, 7, 64, 131], "per_chunk", "selector", True, 2, None),
    "all-selected-grouped-seg4-tau12": ([261, 130], "grouped", "all", False, 4, 12.0),
    "only-anchors-per_chunk-h0": ([330, 1, 129], "per_chunk", "anchors", True, None, 12.0),
    "only-anchors-grouped-seg2": ([450, 129], "grouped", "anchors", True, 2, None),
}


@needs_kernels
@pytest.mark.parametrize("case", list(CASES))
def test_csr_pass_equals_walk_pass_and_spec(case):
    lengths, output, mask_kind, with_h0, seg, tau = CASES[case]
    (q, k, v, g, beta, h0, gate, w, cu), trace = _spec_and_inputs(lengths, output, mask_kind, with_h0)
    xs = _to([q, k, v, g, beta, gate, w], torch.float32)
    hd = None if h0 is None else h0.to(DEV, torch.float32)
    results = {}
    for main_pass in ("walk", "csr"):
        cfg = SparseGDNConfig(output=output, warmup_log_decay=tau)
        kernel_cfg = SparseGDNKernelConfig(backend="triton", main_pass=main_pass, segment_chunks=seg)
        o, s, _, _ = launch.run_kernels(
            *xs[:5], None, hd, cu.to(DEV), gate=xs[5], gate_norm_weight=xs[6], config=cfg, kernel_config=kernel_cfg,
            mask=trace.selection.mask,
        )  # fmt: skip
        results[main_pass] = o.cpu(), s.cpu()
    (o_w, s_w), (o_c, s_c) = results["walk"], results["csr"]
    assert rel_err(o_c, trace.o) <= 1e-5 and rel_err(s_c, trace.recurrence.final_state) <= 1e-5
    assert rel_err(o_c, o_w) <= 1e-5 and rel_err(s_c, s_w) <= 1e-5


def _main_pass_on_fp32(lengths, state_dtype, output="grouped", seed=0):
    """The csr main pass on the kernels' own coefficients and the spec's mask (fp32 inputs), with the states after
    each event stored in ``state_dtype``."""
    from longsparse.ops.gdn.intra import intra_forward

    (q, k, v, g, beta, h0, gate, w, cu), trace = _spec_and_inputs(lengths, output, "selector", True, seed)
    layout = build_layout(1, q.shape[1], cu, DEV)  # on the device, as run_kernels builds it
    selection = dataclasses.replace(trace.selection, mask=trace.selection.mask.to(DEV))
    qf, kf, vf, gf, bf = (x[0] for x in _to([q, k, v, g, beta], torch.float32))
    bos, clen = layout.token_index[:, 0].int(), layout.chunk_len.int()
    ct, gamma, _ = intra_forward(kf, vf, gf, bf, bos, clen)
    cfg = SparseGDNConfig(output=output)
    o, s = launch._main_pass(
        qf,
        kf,
        vf,
        gf,
        ct,
        gamma,
        selection,
        layout,
        lengths,
        bos,
        clen,
        h0.to(DEV, torch.float32),
        q.shape[-1] ** -0.5,
        cfg,
        SparseGDNKernelConfig(main_pass="csr"),
        state_dtype=state_dtype,
    )
    return o.cpu().view(1, *o.shape), s.cpu(), trace, (q, k, v, g, beta, h0, cu)


@needs_kernels
def test_bf16_event_states_cost_less_than_bf16_inputs():
    """The choice of the states' dtype (docs/gdn-kernels.md): fp32 inputs with the states after each event stored
    in bf16 move the output by less than the dense path's own drift with bf16 inputs; the final state, kept in
    registers, does not move."""
    lengths = [450, 131]
    o16, s16, trace, (q, k, v, g, beta, h0, cu) = _main_pass_on_fp32(lengths, torch.bfloat16)
    o32, s32, *_ = _main_pass_on_fp32(lengths, torch.float32)
    ref32, _ = naive_chunk_gated_delta_rule(
        q.float(), k.float(), v.float(), g.float(), beta.float(), initial_state=h0.float(), cu_seqlens=cu
    )
    ref16, _ = naive_chunk_gated_delta_rule(
        *(x.bfloat16() for x in (q, k, v, g, beta)), initial_state=h0.float(), cu_seqlens=cu
    )
    drift = rel_err(ref16, ref32)
    cost = rel_err(o16, trace.o)
    print(f"bf16 event states: output {cost:.2e} from the spec; dense path with bf16 inputs: {drift:.2e}")
    assert rel_err(o32, trace.o) <= 1e-5
    assert cost <= drift / 1.5, (cost, drift)
    assert rel_err(s16, s32) <= 1e-6


@pytest.mark.parametrize("ratios", [(0.08, 0.30, 0.95), (0.05, 0.25, 0.85), (0.1, 0.5, 1.0)])
def test_event_capacity_host_arithmetic_equals_the_spec_tier_sizes(ratios):
    """The bound is computed with plain integers on the host; per sequence it equals the specification's tensor
    formula (``tier_sizes`` k_ℓ, the tier table's worst entry) at every length up to 8,000 chunks."""
    from longsparse.ops.gdn.selection import tier_sizes, tier_table

    P = 16
    chunks = torch.arange(0, 8001)
    k_low, k_mid, k_high = tier_sizes(chunks, ratios).unbind(-1)
    entries = [(h, m) for h, mids in tier_table(P, ratios).items() for m in mids]
    want = torch.stack([h * k_high + m * k_mid + (P - h - m) * k_low for h, m in entries]).max(0).values
    cfg = SparseGDNConfig(tier_ratios=ratios)
    got = [csr.event_capacity([64 * int(c)], P, cfg) for c in chunks]
    assert got == want.tolist()
