"""SparseGDN public op: varlen equals per-sequence calls, dtypes, the config, and clear errors for bad input."""

import pytest
import torch

from longsparse.ops.gdn import (
    SparseGDNConfig,
    SparseGDNKernelConfig,
    SparseGDNStats,
    naive_recurrent_gated_delta_rule,
    sparse_chunk_gated_delta_rule,
)
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gate, make_gdn_inputs, spread_decays


@pytest.mark.parametrize("output", ["grouped", "per_chunk"])
def test_varlen_equals_per_sequence_calls(output):
    lengths = [1, 0, 64 * 3 + 63, 64 * 5, 64 * 9 + 30]
    T, N, HV = sum(lengths), len(lengths), 8
    q, k, v, _, beta, h0 = make_gdn_inputs(1, T, 4, HV, 8, 8, with_state=True, n_states=N)
    g = spread_decays(1, T, HV)
    gate, w = make_gate(1, T, HV, 8)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    cfg = SparseGDNConfig(output=output)
    o, s, stats = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, None, h0, True, False, cu, gate=gate, gate_norm_weight=w, config=cfg, return_stats=True
    )
    assert o.shape == v.shape and s.shape == h0.shape
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = slice(a, b)
        o_n, s_n, st_n = sparse_chunk_gated_delta_rule(
            q[:, part],
            k[:, part],
            v[:, part],
            g[:, part],
            beta[:, part],
            initial_state=h0[n : n + 1],
            output_final_state=True,
            gate=gate[:, part],
            gate_norm_weight=w,
            config=cfg,
            return_stats=True,
        )
        C = int(st_n.chunks_per_seq[0])
        assert torch.equal(stats.mask[n, :, :C], st_n.mask[0]) and not stats.mask[n, :, C:].any()
        assert torch.equal(stats.tiers[n], st_n.tiers[0])
        if b > a:
            assert rel_err(o[:, part], o_n) <= 1e-13
        assert rel_err(s[n : n + 1], s_n) <= 1e-13
    assert torch.equal(s[1], h0[1])  # the empty sequence keeps its initial state


def test_return_values_dtypes_and_stats():
    q, k, v, g, beta, _ = make_gdn_inputs(2, 64 * 4 + 1, 2, 4, 8, 8)
    o, s = sparse_chunk_gated_delta_rule(q, k, v, g, beta)
    assert s is None and o.dtype == torch.float64 and o.shape == v.shape
    o, s, stats = sparse_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, return_stats=True)
    assert isinstance(stats, SparseGDNStats) and s.shape == (2, 4, 8, 8)
    assert stats.mask.shape == (2, 2, 5) and stats.events_per_pair.tolist() == stats.mask.sum(-1).tolist()
    assert stats.keep_ratio == pytest.approx(float(stats.mask.sum()) / (2 * 2 * 5))
    assert stats.keep_ratio_per_seq.shape == (2,) and stats.num_events == int(stats.mask.sum())
    ratio = stats.keep_ratio_device  # what a model collects per layer without a host read
    assert ratio.dim() == 0 and ratio.dtype == torch.float64 and ratio.item() == stats.keep_ratio


def test_bf16_inputs_run_and_compute_in_float32():
    T = 64 * 6 + 5
    q, k, v, g, beta, h0 = make_gdn_inputs(1, T, 2, 4, 16, 16, with_state=True)
    gate, w = make_gate(1, T, 4, 16)
    lo = [x.to(torch.bfloat16) for x in (q, k, v, g, beta)]
    o, s = sparse_chunk_gated_delta_rule(
        *lo, initial_state=h0.float(), output_final_state=True, gate=gate.bfloat16(), gate_norm_weight=w.bfloat16()
    )
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32 and o.isfinite().all()
    exact = SparseGDNConfig(solve="full", selection="all")
    o, s = sparse_chunk_gated_delta_rule(*lo, initial_state=h0.float(), output_final_state=True, config=exact)
    o_ref, s_ref = naive_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel_err(o, o_ref) < 2e-2 and rel_err(s, s_ref) < 2e-2  # the bf16 rounding of the inputs


def test_empty_input():
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 0, 2, 4, 8, 8, with_state=True)
    o, s, stats = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, return_stats=True
    )
    assert o.shape == (1, 0, 4, 8) and torch.equal(s, h0) and stats.num_events == 0


def test_auto_backend_runs_the_specification_off_the_gpu():
    """Off a GPU "auto" is the torch specification, even when Triton's interpreter is on."""
    q, k, v, g, beta, _ = make_gdn_inputs(1, 70, 1, 1, 4, 4)
    o_auto, _ = sparse_chunk_gated_delta_rule(q, k, v, g, beta)
    o_torch, _ = sparse_chunk_gated_delta_rule(q, k, v, g, beta, kernel_config=SparseGDNKernelConfig(backend="torch"))
    assert torch.equal(o_auto, o_torch) and o_auto.dtype == torch.float64


BAD_CONFIGS = {
    "ratios-not-increasing": (dict(tier_ratios=(0.3, 0.2, 0.9)), "tier_ratios"),
    "ratios-above-one": (dict(tier_ratios=(0.1, 0.3, 1.2)), "tier_ratios"),
    "ratios-two": (dict(tier_ratios=(0.1, 0.3)), "tier_ratios"),
    "solve": (dict(solve="exact"), "solve"),
    "selection": (dict(selection="topk"), "selection"),
    "output": (dict(output="mapped"), "output"),
    "visibility": (dict(visibility=1), "visibility"),
    "tail-0": (dict(tail=0), "tail"),
    "tail-65": (dict(tail=65), "tail"),
    "lifetime-window": (dict(lifetime_window=0), "lifetime_window"),
    "seed": (dict(seed=-1), "seed"),
    "fixed-tiers-sum": (dict(fixed_tiers=(9, 4, 4)), "fixed_tiers"),
    "fixed-tiers-negative": (dict(fixed_tiers=(17, 0, -1)), "fixed_tiers"),
}
BAD_KERNEL_CONFIGS = {
    "backend": (dict(backend="cuda"), "backend"),
    "main-pass": (dict(main_pass="dense"), "main_pass"),
    "walk-correction": (dict(walk_correction="wks"), "walk_correction"),
    "walk-scores": (dict(walk_scores="global"), "walk_scores"),
    "walk-output-role": (dict(walk_output_role="yes"), "walk_output_role must be a bool"),
    "walk-kernel": (dict(walk_kernel="tilelang"), "walk_kernel"),
    "select-kernel": (dict(select_kernel="two"), "select_kernel"),
    "block-v-48": (dict(block_v=48), "block_v"),
    "block-v-bool": (dict(block_v=True), "block_v"),
    "intra-warps": (dict(intra_warps=2), "intra_warps"),
    "intra-registers": (dict(intra_registers=170), "intra_registers"),
    "main-warps": (dict(main_warps=16), "main_warps"),
    "segment-chunks-odd": (dict(segment_chunks=3), "segment_chunks"),
    "walk-warp-specialised": (dict(walk_warp_specialised=1), "walk_warp_specialised must be a bool"),
    "walk-stages": (dict(walk_stages=3), "walk_stages"),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_bad_config_raises(name):
    fields, pattern = BAD_CONFIGS[name]
    with pytest.raises(ValueError, match=pattern):
        SparseGDNConfig(**fields)


@pytest.mark.parametrize("name", list(BAD_KERNEL_CONFIGS))
def test_bad_kernel_config_raises(name):
    fields, pattern = BAD_KERNEL_CONFIGS[name]
    with pytest.raises(ValueError, match=pattern):
        SparseGDNKernelConfig(**fields)


def _args(**overrides):
    q, k, v, g, beta, _ = make_gdn_inputs(1, 70, 2, 4, 8, 8)
    gate, w = make_gate(1, 70, 4, 8)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, gate=gate, gate_norm_weight=w)
    args.update(overrides)
    return args


BAD_INPUTS = {
    "gate-shape": (lambda: _args(gate=torch.zeros(1, 70, 4, 4, dtype=torch.float64)), r"gate must be \[B, T, HV, V\]"),
    "gate-int": (lambda: _args(gate=torch.zeros(1, 70, 4, 8, dtype=torch.long)), "gate must be a floating-point"),
    "gate-device": (lambda: _args(gate=torch.zeros(1, 70, 4, 8, device="meta")), "gate must be on"),
    "weight-shape": (
        lambda: _args(gate_norm_weight=torch.ones(4, dtype=torch.float64)),
        r"gate_norm_weight must be \[V\]",
    ),
    "weight-without-gate": (lambda: _args(gate=None), "without gate"),
    "config-type": (lambda: _args(config={"selection": "all"}), "config must be a SparseGDNConfig"),
    "kernel-config-type": (
        lambda: _args(kernel_config=SparseGDNConfig()),
        "kernel_config must be a SparseGDNKernelConfig",
    ),
    "hv-not-multiple": (lambda: _args(k=torch.randn(1, 70, 3, 8, dtype=torch.float64)), "same shape"),
    "cu_seqlens-wrong-end": (lambda: _args(gate=None, gate_norm_weight=None, cu_seqlens=torch.tensor([0, 9])), "end"),
    "initial-state-shape": (lambda: _args(initial_state=torch.zeros(1, 2, 8, 8)), "initial_state"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs_raise_clear_errors(name):
    make, pattern = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=pattern):
        sparse_chunk_gated_delta_rule(**make())


def test_bad_mask_override_raises():
    from tests.ops.gdn.helpers import spec_trace

    q, k, v, g, beta, _ = make_gdn_inputs(1, 70, 2, 4, 8, 8)
    with pytest.raises(ValueError, match="mask must be a bool tensor of shape"):
        spec_trace(q, k, v, g, beta, mask=torch.ones(1, 2, 3, dtype=torch.bool))
