"""The short causal convolution: the Triton kernel (Triton's interpreter on the CPU, compiled on a GPU) against the
per-sequence ``F.conv1d`` reference in float64 — varlen with empty and one-token sequences, conv states carried
between calls, no activation — and bad input refused with the argument named."""

import pytest
import torch

from longsparse.ops._triton import kernels_can_run_on
from longsparse.ops.conv import causal_conv1d, causal_conv1d_ref
from tests.helpers import rel_err

pytest.importorskip("triton")
needs_kernel = pytest.mark.skipif(not kernels_can_run_on(torch.device("cpu")), reason="needs Triton's interpreter")
OFFSETS = [0, 5, 5, 40, 41, 100]  # lengths 5, 0, 35, 1, 59


def _inputs(T, C, W, N, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, C, generator=gen, dtype=torch.float64).to(dtype)
    w = (torch.randn(C, W, generator=gen, dtype=torch.float64) / W**0.5).to(dtype)
    s = torch.randn(N, C, W - 1, generator=gen, dtype=torch.float64).to(dtype)
    return x, w, s


@needs_kernel
@pytest.mark.parametrize("with_state", [False, True], ids=["zeros", "state"])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("C", [130, 64])  # a partial channel tile, and one exact
def test_kernel_matches_the_float64_reference(with_state, activation, C):
    x, w, s = _inputs(OFFSETS[-1], C, 4, len(OFFSETS) - 1)
    init = s if with_state else None
    y, final = causal_conv1d(x, w, OFFSETS, init, activation=activation)
    y_cu, final_cu = causal_conv1d(x, w, OFFSETS, init, activation=activation, cu_seqlens=torch.tensor(OFFSETS))
    assert torch.equal(y_cu, y) and torch.equal(final_cu, final)  # the boundaries given on the device
    want, want_final = causal_conv1d_ref(x.double(), w.double(), OFFSETS, None if init is None else init.double(),
                                         activation)  # fmt: skip
    assert y.dtype == x.dtype and y.shape == x.shape and rel_err(y, want) < 1e-6
    assert torch.equal(final, want_final.to(final.dtype))  # copies of inputs, bit for bit


@needs_kernel
def test_two_calls_with_the_state_carried_equal_one_call():
    """Prefill in two chunks (the state of the first feeds the second) = one prefill over both, for every
    sequence, including those shorter than the kernel's reach."""
    x, w, s = _inputs(60, 48, 4, 3, seed=1)
    whole = [0, 12, 26, 60]
    xs = [x[whole[n] : whole[n + 1]] for n in range(3)]
    cut = [10, 2, 18]
    part1 = torch.cat([xs[n][: cut[n]] for n in range(3)])
    part2 = torch.cat([xs[n][cut[n] :] for n in range(3)])
    off1 = [0, 10, 12, 30]
    off2 = [0, 2, 14, 30]
    y1, st = causal_conv1d(part1, w, off1, s)
    y2, st2 = causal_conv1d(part2, w, off2, st)
    y, final = causal_conv1d(x, w, whole, s)
    for n in range(3):
        got = torch.cat([y1[off1[n] : off1[n + 1]], y2[off2[n] : off2[n + 1]]])
        assert torch.allclose(got, y[whole[n] : whole[n + 1]], atol=1e-6), n
    assert torch.equal(st2, final)


def test_reference_is_the_layer_convolution():
    """The reference equals ``nn.Conv1d`` with left padding on one sequence from zeros (what the layer computed)."""
    x, w, _ = _inputs(33, 8, 4, 1, seed=2)
    conv = torch.nn.Conv1d(8, 8, 4, groups=8, bias=False, padding=3).double()
    conv.weight.data = w.double()[:, None, :]
    want = torch.nn.functional.silu(conv(x.double().T[None])[0, :, :33].T)
    y, _ = causal_conv1d_ref(x.double(), w.double(), [0, 33])
    assert torch.allclose(y, want, atol=1e-12)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(x=torch.zeros(4, 8, 2)), r"x must be .*\[T, C\]"),
        (dict(weight=torch.zeros(9, 4)), "weight must be"),
        (dict(offsets=[0, 5, 3, 10]), "offsets must rise"),
        (dict(offsets=[0, 9]), "offsets must rise from 0 to T = 10"),
        (dict(initial_states=torch.zeros(2, 8, 2)), r"initial_states must be \[N, C, W - 1\] = \[2, 8, 3\]"),
        (dict(activation="gelu"), "activation must be"),
    ],
)
def test_bad_input_is_refused(change, match):
    args = dict(x=torch.zeros(10, 8), weight=torch.zeros(8, 4), offsets=[0, 4, 10], initial_states=None)
    args.update(change)
    activation = args.pop("activation", "silu")
    with pytest.raises(ValueError, match=match):
        causal_conv1d(**args, activation=activation)


@pytest.mark.gpu
def test_bf16_kernel_on_the_gpu_matches_the_reference():
    """Qwen3.5-4B's conv width (8,192 channels, 4 taps), bf16, varlen with states: within bf16 rounding of the
    float64 reference (the kernel accumulates in float32 and rounds once)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    offsets = [0, 4097, 4098, 12000]
    x, w, s = (t.cuda().bfloat16() for t in _inputs(12000, 8192, 4, 3, seed=3))
    y, final = causal_conv1d(x, w, offsets, s)
    want, want_final = causal_conv1d_ref(x.double(), w.double(), offsets, s.double())
    assert rel_err(y, want) < 2**-8 and torch.equal(final, want_final.bfloat16())


@needs_kernel
def test_inputs_that_need_gradients_take_the_differentiable_path():
    """The kernel has no backward: with autograd on, gradients still reach x and the weight (torch reference), and
    asking for the kernel then is refused; under no_grad the kernel runs."""
    x, w, s = _inputs(20, 8, 4, 2, seed=4)
    x.requires_grad_(True)
    w.requires_grad_(True)
    y, _ = causal_conv1d(x, w, [0, 7, 20], s)
    y.square().sum().backward()
    want_x, want_w = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    ref, _ = causal_conv1d_ref(x, w, [0, 7, 20], s)
    ref.square().sum().backward()
    assert torch.allclose(want_x, x.grad) and torch.allclose(want_w, w.grad) and want_w.abs().sum() > 0
    with pytest.raises(ValueError, match="autograd needs a backward"):
        causal_conv1d(x, w, [0, 7, 20], s, use_kernel=True)
    with torch.no_grad():
        y_kernel, _ = causal_conv1d(x, w, [0, 7, 20], s, use_kernel=True)
    assert torch.allclose(y_kernel, ref.detach(), atol=1e-6)
