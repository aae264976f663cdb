"""The dense GDN core's kernel choice: FLA's Triton kernel where it can run on 16-bit inputs, the torch reference
elsewhere."""

import sys
import types

import pytest
import torch

from longsparse.models.gdn import DenseGDN
from longsparse.ops.gdn import naive_chunk_gated_delta_rule
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gdn_inputs


def _call(core, q, k, v, g, beta, h0, cu):
    gate = torch.zeros_like(v)
    return core(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, gate=gate, gate_norm_weight=v.new_ones(v.shape[-1]))


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel must be one of auto, fla, torch, got 'triton'"):
        DenseGDN("triton")


def test_fla_on_cpu_tensors_is_refused_with_the_device():
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 70, 2, 4, 16, 16, dtype=torch.float32, with_state=True, n_states=1)
    with pytest.raises(ValueError, match="kernel='fla' needs CUDA tensors, got cpu"):
        _call(DenseGDN("fla"), q, k, v, g, beta, h0, torch.tensor([0, 70]))


def test_auto_runs_the_reference_on_cpu():
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 130, 2, 4, 16, 16, dtype=torch.float32, with_state=True, n_states=2)
    cu = torch.tensor([0, 61, 130])
    core = DenseGDN()
    o, state, keep = _call(core, q, k, v, g, beta, h0, cu)
    want_o, want_s = naive_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu
    )
    assert core.last_kernel == "torch" and keep is None
    assert torch.equal(o, want_o) and torch.equal(state, want_s.float())


@pytest.fixture
def fake_fla(monkeypatch):
    """An importable stand-in for ``fla.ops.gated_delta_rule`` (FLA is a GPU-only optional package)."""

    def chunk_gated_delta_rule(*args, **kwargs):
        raise AssertionError("not called by _fla")

    for name in ("fla", "fla.ops", "fla.ops.gated_delta_rule"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["fla.ops.gated_delta_rule"].chunk_gated_delta_rule = chunk_gated_delta_rule
    return chunk_gated_delta_rule


def test_auto_gives_fla_16_bit_cuda_inputs_and_float32_the_reference(fake_fla):
    """FLA's forward runs float32 inputs through tf32 products (~1e-3 relative): a float32 model on the GPU would
    miss float32 accuracy (the 1e-4 of the model tests) under "auto"; "fla" is still honoured."""
    cuda = torch.device("cuda")
    assert DenseGDN()._fla(cuda, torch.bfloat16) is fake_fla
    assert DenseGDN()._fla(cuda, torch.float16) is fake_fla
    assert DenseGDN()._fla(cuda, torch.float32) is None
    assert DenseGDN()._fla(torch.device("cpu"), torch.bfloat16) is None
    assert DenseGDN("fla")._fla(cuda, torch.float32) is fake_fla
    assert DenseGDN("torch")._fla(cuda, torch.bfloat16) is None


@pytest.mark.gpu
def test_fla_kernel_matches_the_reference_on_the_gpu():
    pytest.importorskip("fla", reason="needs the optional package fla")
    q, k, v, g, beta, h0 = make_gdn_inputs(
        1, 4096 + 77, 16, 32, 128, 128, dtype=torch.float32, with_state=True, n_states=2
    )
    q, k, v, g, beta, h0 = (x.cuda() for x in (q, k, v, g, beta, h0))
    cu = torch.tensor([0, 1000, 4096 + 77], device="cuda")
    bf = [x.bfloat16() for x in (q, k, v)]
    o_ref, s_ref, _ = _call(DenseGDN("torch"), q, k, v, g, beta, h0, cu)
    core = DenseGDN()
    o, s, _ = _call(core, *bf, g, beta, h0, cu)
    assert core.last_kernel == "fla"
    assert rel_err(o, o_ref) <= 2e-2 and rel_err(s, s_ref) <= 2e-2
