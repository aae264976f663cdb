"""The gated RMS norm: the Triton kernel (Triton's interpreter on the CPU, compiled on a GPU) against the reference,
the reference against transformers' own Qwen3.5 ``RMSNormGated``, autograd falling back to the reference, and bad
input refused."""

import pytest
import torch

from longsparse.ops._triton import kernels_can_run_on
from longsparse.ops.norm import gated_rms_norm, gated_rms_norm_ref
from tests.helpers import rel_err

pytest.importorskip("triton")
needs_kernel = pytest.mark.skipif(not kernels_can_run_on(torch.device("cpu")), reason="needs Triton's interpreter")


def _inputs(shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(shape, generator=gen)).to(dtype)
    z = torch.randn(shape, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype)
    return x, z, w


@needs_kernel
@pytest.mark.parametrize("shape", [(37, 4, 128), (5, 96), (1, 1, 16)], ids=["heads", "odd-width", "one-row"])
def test_kernel_matches_the_reference(shape):
    x, z, w = _inputs(shape)
    got = gated_rms_norm(x, z, w, 1e-6)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert rel_err(got, gated_rms_norm_ref(x.double(), z.double(), w.double(), 1e-6)) < 1e-6


def test_reference_is_transformers_rmsnorm_gated():
    modeling = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    x, z, w = _inputs((9, 4, 32), seed=1, dtype=torch.bfloat16)
    theirs = modeling.Qwen3_5RMSNormGated(32, eps=1e-6).to(torch.bfloat16)
    theirs.weight.data.copy_(w)
    assert torch.equal(gated_rms_norm_ref(x, z, w, 1e-6), theirs(x, z))


@needs_kernel
def test_inputs_that_need_gradients_take_the_differentiable_path():
    x, z, w = _inputs((6, 32), seed=2)
    w.requires_grad_(True)
    gated_rms_norm(x, z, w, 1e-6).sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="autograd needs a backward"):
        gated_rms_norm(x, z, w, 1e-6, use_kernel=True)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(z=torch.zeros(4, 16)), "x and z must have one shape"),
        (dict(weight=torch.zeros(8)), r"weight must be \[D\] = \[32\]"),
        (dict(x=torch.zeros(4, 32, dtype=torch.int32)), "x must be a floating-point tensor"),
    ],
)
def test_bad_input_is_refused(change, match):
    args = dict(x=torch.zeros(4, 32), z=torch.zeros(4, 32), weight=torch.ones(32))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        gated_rms_norm(**args, eps=1e-6)


@pytest.mark.gpu
def test_bf16_kernel_on_the_gpu_rounds_like_the_module():
    """Qwen3.5's GDN output shapes (32 heads of 128), bf16: equal to the module's arithmetic but for the last-bit
    rounding of float32 reductions in another order (at most one bf16 step on a few elements)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, z, w = (t.cuda() for t in _inputs((4099, 32, 128), seed=3, dtype=torch.bfloat16))
    got, want = gated_rms_norm(x, z, w, 1e-6), gated_rms_norm_ref(x, z, w, 1e-6)
    step = (want.float().abs() * 2**-7).clamp_min(1e-30)
    assert ((got.float() - want.float()).abs() <= step).all() and (got != want).float().mean() < 0.01
