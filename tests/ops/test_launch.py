"""FastLaunch: launches through the kept compiled kernel equal the JIT's own, per specialisation."""

from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from longsparse.ops._launch import FastLaunch, _arg_key, fast  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _axpb_kernel(x, out, a, n, stride, BLOCK: tl.constexpr, ADD: tl.constexpr = True):
    """out[i] = a * x[i * stride] (+ n where ADD) for i < n."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = i < n
    y = tl.load(x + i * stride, mask=keep, other=0.0) * a
    if ADD:
        y = y + n
    tl.store(out + i, y, mask=keep)


def _expected(x, a, n, stride, add=True):
    return x[: n * stride : stride] * a + (n if add else 0)


def test_arg_key_separates_what_triton_specialises_on():
    base = torch.zeros(64, dtype=torch.float32)
    assert _arg_key(base) == _arg_key(base[4:])  # 16-byte offset: still aligned
    assert _arg_key(base) != _arg_key(base[1:])  # 4-byte offset: not aligned
    assert _arg_key(base) != _arg_key(base.half())
    assert _arg_key(7) == _arg_key(9)
    assert len({_arg_key(1), _arg_key(7), _arg_key(32)}) == 3  # == 1, plain, multiple of 16
    assert _arg_key(2**31 - 1) != _arg_key(2**31 + 1)  # i32 against i64
    assert _arg_key(2**63 + 1) != _arg_key(2**62 + 1)  # u64 against i64
    assert _arg_key(True) != _arg_key(False) != _arg_key(0)
    assert _arg_key(0.5) == _arg_key(3.0) != _arg_key(3)
    assert _arg_key(None) is None
    desc = SimpleNamespace(base=base, shape=[64], strides=[1], block_shape=[16], layout="L", padding="zero")
    other = SimpleNamespace(base=base, shape=[64], strides=[1], block_shape=[32], layout="L", padding="zero")
    assert _arg_key(desc) != _arg_key(other)
    with pytest.raises(TypeError, match="no specialisation key"):
        _arg_key("a string")


def test_fast_launch_equals_the_jit_and_keeps_one_kernel_per_specialisation():
    launcher = FastLaunch(_axpb_kernel)
    x = torch.randn(300, device=DEV)
    for n, stride, offset, add in [(100, 1, 0, True), (100, 1, 0, True), (77, 2, 1, True), (1, 1, 0, False),
                                   (100, 1, 0, True), (32, 3, 3, True)]:  # fmt: skip
        xs = x[offset:]
        out = torch.full((n,), float("nan"), device=DEV)
        launcher[(triton.cdiv(n, 64),)](xs, out, 0.5, n, stride, BLOCK=64, ADD=add, num_warps=2)
        torch.testing.assert_close(out, _expected(xs, 0.5, n, stride, add), rtol=0, atol=0)
    if launcher._fast:  # compiled: four specialisations (aligned / not, n == 1 with ADD off, stride 3)
        assert launcher.specialisations == 4
    assert fast(_axpb_kernel) is fast(_axpb_kernel)


def test_fast_launch_refuses_a_missing_argument():
    launcher = FastLaunch(_axpb_kernel)
    x = torch.randn(64, device=DEV)
    out = torch.empty(64, device=DEV)
    launcher[(1,)](x, out, 1.0, 64, 1, BLOCK=64)
    with pytest.raises(TypeError, match="missing"):
        launcher[(1,)](x, out, 1.0, 64, BLOCK=64)
