"""The RMS norms: the Triton kernel (Triton's interpreter on the CPU, compiled on a GPU) against the references, the
references against transformers' own Qwen3.5 and Llama norms, autograd falling back to the references, and bad input
refused. The interpreter tests run in float32: Triton's interpreter (3.6 and 3.7) multiplies two bf16 tensors wrongly
(values off by ~1e22), so the bf16 rounding steps are checked on the GPU only."""

import pytest
import torch

from longsparse.ops._triton import kernels_can_run_on
from longsparse.ops.norm import gated_rms_norm, gated_rms_norm_ref, l2_norm, l2_norm_ref, rms_norm, rms_norm_ref
from longsparse.ops.norm.rms import rows_per_program
from tests.helpers import rel_err

pytest.importorskip("triton")
needs_kernel = pytest.mark.skipif(not kernels_can_run_on(torch.device("cpu")), reason="needs Triton's interpreter")


def _inputs(shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(shape, generator=gen)).to(dtype)
    z = torch.randn(shape, generator=gen).to(dtype)
    w = (0.1 * torch.randn(shape[-1], generator=gen)).to(dtype)
    return x, z, w


SHAPES = [(37, 4, 128), (5, 96), (3, 2560)]
IDS = ["heads", "odd-width", "hidden-one-row-per-program"]


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_gated_kernel_matches_the_reference(shape):
    x, z, w = _inputs(shape)
    got = gated_rms_norm(x, z, w + 1, 1e-6)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert rel_err(got, gated_rms_norm_ref(x.double(), z.double(), (w + 1).double(), 1e-6)) < 1e-6


@needs_kernel
@pytest.mark.parametrize("zero_centered", [True, False], ids=["qwen", "llama"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_kernel_matches_the_reference(shape, zero_centered):
    x, _, w = _inputs(shape, seed=1)
    w = w if zero_centered else w + 1
    got = rms_norm(x, w, 1e-5, zero_centered=zero_centered)
    want = rms_norm_ref(x.double(), w.double(), 1e-5, zero_centered)
    assert got.shape == x.shape and got.dtype == x.dtype and rel_err(got, want) < 1e-6


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_l2_kernel_matches_the_reference(shape):
    """And the reference is the GDN ops' own ``l2norm`` (FLA's ``use_qk_l2norm_in_kernel``) in float32."""
    from longsparse.ops.gdn.naive import l2norm

    x, _, _ = _inputs(shape, seed=5)
    got = l2_norm(x)
    assert got.dtype == x.dtype and rel_err(got, l2_norm_ref(x.double())) < 1e-6
    assert torch.equal(l2_norm_ref(x), l2norm(x.float()))


def test_rows_per_program_keep_the_tile_bounded():
    assert rows_per_program(128) == 16 and rows_per_program(96) == 16 and rows_per_program(2560) == 1


def test_references_are_transformers_norms():
    """Bit for bit in bf16: Qwen3.5's RMSNormGated and zero-centred RMSNorm, Llama's RMSNorm."""
    qwen = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    x, z, w = _inputs((9, 4, 32), seed=2, dtype=torch.bfloat16)
    gated = qwen.Qwen3_5RMSNormGated(32, eps=1e-6).to(torch.bfloat16)
    gated.weight.data.copy_(w + 1)
    assert torch.equal(gated_rms_norm_ref(x, z, w + 1, 1e-6), gated(x, z))
    centred = qwen.Qwen3_5RMSNorm(32, eps=1e-6).to(torch.bfloat16)
    centred.weight.data.copy_(w)
    assert torch.equal(rms_norm_ref(x, w, 1e-6, zero_centered=True), centred(x))
    plain = llama.LlamaRMSNorm(32, eps=1e-5).to(torch.bfloat16)
    plain.weight.data.copy_(w + 1)
    assert torch.equal(rms_norm_ref(x, w + 1, 1e-5), plain(x))


@needs_kernel
def test_inputs_that_need_gradients_take_the_differentiable_path():
    x, z, w = _inputs((6, 32), seed=3)
    w.requires_grad_(True)
    (gated_rms_norm(x, z, w, 1e-6).sum() + rms_norm(x, w, 1e-6).sum()).backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="autograd needs a backward"):
        rms_norm(x, w, 1e-6, use_kernel=True)


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
@pytest.mark.parametrize(
    "shape, kind",
    [((4099, 32, 128), "gated"), ((4099, 2560), "qwen"), ((4099, 4096), "llama"), ((4099, 16, 128), "l2")],
)
def test_bf16_kernels_on_the_gpu_round_like_the_modules(shape, kind):
    """Qwen3.5's GDN output, q/k and hidden widths and MiniCPM4's, bf16: equal to the modules' arithmetic but for
    rare last-bit flips. The kernel's float32 rsqrt and reduction order differ from torch's in the last float32 bit;
    where that flips the rounding of x̂ to bf16, the product with the weight and silu(z) can land up to two bf16 steps
    away. Measured on the H200: 2e-6 to 5e-6 of the elements differ, at most 1.7 steps; torch's own reference differs
    from the same arithmetic done in float64 on 6e-6 of them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x, z, w = (t.cuda() for t in _inputs(shape, seed=4, dtype=torch.bfloat16))
    if kind == "gated":
        got, want = gated_rms_norm(x, z, w + 1, 1e-6), gated_rms_norm_ref(x, z, w + 1, 1e-6)
    elif kind == "l2":
        got, want = l2_norm(x), l2_norm_ref(x)
    else:
        centred = kind == "qwen"
        got, want = rms_norm(x, w, 1e-6, zero_centered=centred), rms_norm_ref(x, w, 1e-6, centred)
    two_steps = (want.float().abs() * 2**-6).clamp_min(1e-30)
    assert ((got.float() - want.float()).abs() <= two_steps).all() and (got != want).float().mean() < 1e-4
