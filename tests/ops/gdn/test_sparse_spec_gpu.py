"""SparseGDN spec on a CUDA device: the same numbers and the same masks as on the CPU, and it runs at the Qwen3.5 GDN
geometry in bf16."""

import pytest
import torch

from longsparse.ops.gdn import (
    SparseGDNConfig,
    SparseGDNKernelConfig,
    naive_chunk_gated_delta_rule,
    sparse_chunk_gated_delta_rule,
)
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gate, make_gdn_inputs, spread_decays

pytestmark = pytest.mark.gpu
TORCH = SparseGDNKernelConfig(backend="torch")


def _cuda(xs):
    return [None if x is None else x.cuda() for x in xs]


@pytest.mark.parametrize("selection", ["adaptive", "random"])
def test_cuda_matches_cpu_float64(selection):
    cu = torch.tensor([0, 64 * 66 + 3, 64 * 66 + 3, 64 * 90 + 40])
    T, HV = int(cu[-1]), 32
    q, k, v, _, beta, h0 = make_gdn_inputs(1, T, 16, HV, 8, 8, with_state=True, n_states=3)
    g = spread_decays(1, T, HV)
    gate, w = make_gate(1, T, HV, 8)
    cfg = SparseGDNConfig(selection=selection)
    args = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, gate=gate, gate_norm_weight=w, config=cfg,
                kernel_config=TORCH)  # fmt: skip
    o, s, st = sparse_chunk_gated_delta_rule(q, k, v, g, beta, **args, return_stats=True)
    cuda_args = {key: (val.cuda() if isinstance(val, torch.Tensor) else val) for key, val in args.items()}
    o_g, s_g, st_g = sparse_chunk_gated_delta_rule(*_cuda((q, k, v, g, beta)), **cuda_args, return_stats=True)
    assert torch.equal(st_g.mask.cpu(), st.mask) and torch.equal(st_g.tiers.cpu(), st.tiers)
    assert rel_err(o_g.cpu(), o) <= 1e-12 and rel_err(s_g.cpu(), s) <= 1e-12


def test_exact_mode_matches_dense_float32_at_qwen_geometry():
    T = 4096 + 77
    q, k, v, g, beta, h0 = _cuda(make_gdn_inputs(1, T, 16, 32, 128, 128, dtype=torch.float32, with_state=True))
    cfg = SparseGDNConfig(solve="full", selection="all")
    o, s = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, config=cfg, kernel_config=TORCH
    )
    o_ref, s_ref = naive_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert rel_err(o, o_ref) <= 1e-4 and rel_err(s, s_ref) <= 1e-4


def test_bf16_long_input_runs_at_qwen_geometry():
    T, HV, D = 16384 + 77, 32, 128
    q, k, v, _, beta, _ = make_gdn_inputs(1, T, 16, HV, D, D, dtype=torch.bfloat16)
    g = spread_decays(1, T, HV, dtype=torch.bfloat16)
    gate, w = make_gate(1, T, HV, D, dtype=torch.bfloat16)
    q, k, v, g, beta, gate, w = _cuda((q, k, v, g, beta, gate, w))
    o, s, st = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, return_stats=True, kernel_config=TORCH
    )
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32 and o.isfinite().all() and s.isfinite().all()
    C = int(st.chunks_per_seq[0])
    assert C >= 64 and 0.284375 - 0.5 / C <= st.keep_ratio <= 0.313125 + 0.5 / C
    # bf16 inputs compute in float32: the same values given as float32 give the same mask and output
    o32, s32, st32 = sparse_chunk_gated_delta_rule(
        *(x.float() for x in (q, k, v, g, beta)),
        output_final_state=True,
        gate=gate.float(),
        gate_norm_weight=w.float(),
        return_stats=True,
        kernel_config=TORCH,
    )
    assert torch.equal(st32.mask, st.mask)
    assert rel_err(o, o32) <= 1e-2 and rel_err(s, s32) <= 1e-6
