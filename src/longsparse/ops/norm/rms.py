"""The RMS norms' entry points: argument checks and the Triton launch."""

from __future__ import annotations

import torch

from .._launch import fast
from .._triton import forward_kernel_choice
from ..sparse_attn.checks import shape_str
from ..sparse_attn.launch import load_kernels, next_pow2
from .naive import gated_rms_norm_ref, l2_norm_ref, rms_norm_ref

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TILE_ELEMENTS = 2048
"""Elements one program normalises: 16 rows of a 128-wide head, one row of a 2,048-wide hidden state (wider rows
take one program each, at 8 warps)."""


def rows_per_program(width: int) -> int:
    """Rows of ``width`` (padded to a power of two) per program: ``TILE_ELEMENTS`` in all, at least one."""
    return max(1, TILE_ELEMENTS // next_pow2(width))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, zero_centered: bool = False, use_kernel: bool | None = None
) -> torch.Tensor:
    """RMS norm over the last dim of ``x [..., D]`` (``weight [D]``), as :func:`~.naive.rms_norm_ref` computes it.

    ``use_kernel``: None runs the Triton kernel where it can (a GPU, or Triton's interpreter for CPU tensors) and
    autograd does not need a backward (the kernel has none); True requires it; False runs the torch reference.
    """
    _check(weight, x=x)
    if not forward_kernel_choice(use_kernel, x, weight, dtypes=KERNEL_DTYPES):
        return rms_norm_ref(x, weight, eps, zero_centered)
    out_dtype = x.dtype if zero_centered else torch.promote_types(weight.dtype, x.dtype)
    return _launch(x, None, weight, eps, out_dtype, zero_centered=zero_centered)


def gated_rms_norm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, *, use_kernel: bool | None = None
) -> torch.Tensor:
    """``w · x̂ · silu(z)`` over the last dim of ``x, z [..., D]`` (``weight [D]``), in ``x``'s dtype (see
    :func:`~.naive.gated_rms_norm_ref`); ``use_kernel`` as for :func:`rms_norm`."""
    _check(weight, x=x, z=z)
    if z.shape != x.shape:
        raise ValueError(f"x and z must have one shape [..., D], got x {shape_str(x)} and z {shape_str(z)}")
    if not forward_kernel_choice(use_kernel, x, weight, z, dtypes=KERNEL_DTYPES):
        return gated_rms_norm_ref(x, z, weight, eps)
    return _launch(x, z, weight, eps, x.dtype, zero_centered=False)


def l2_norm(x: torch.Tensor, eps: float = 1e-6, *, use_kernel: bool | None = None) -> torch.Tensor:
    """``x / sqrt(sum(x²) + eps)`` over the last dim of ``x [..., D]`` in float32, in ``x``'s dtype (see
    :func:`~.naive.l2_norm_ref`); ``use_kernel`` as for :func:`rms_norm`."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise ValueError("x must be a floating-point tensor [..., D]")
    if not forward_kernel_choice(use_kernel, x, dtypes=KERNEL_DTYPES):
        return l2_norm_ref(x, eps)
    return _launch(x, None, x, eps, x.dtype, zero_centered=False, l2=True)


def _check(weight: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Floating-point tensors on one device, ``weight [D]`` for ``x [..., D]``."""
    for name, t in {**tensors, "weight": weight}.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor")
    x = tensors["x"]
    if x.dim() < 1:
        raise ValueError(f"x must be [..., D], got {shape_str(x)}")
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must be [D] = [{x.shape[-1]}], got {shape_str(weight)}")
    devices = {t.device for t in (*tensors.values(), weight)}
    if len(devices) > 1:
        raise ValueError(f"{', '.join(tensors)} and weight must share a device, got {sorted(map(str, devices))}")


def _launch(x, z, weight, eps, out_dtype, *, zero_centered: bool, l2: bool = False) -> torch.Tensor:
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    z2 = None if z is None else z.reshape(-1, D)
    if z2 is not None and z2.stride(-1) != 1:
        z2 = z2.contiguous()
    R = x2.shape[0]
    out = torch.empty(R, D, dtype=out_dtype, device=x.device)
    if R and D:
        BR = rows_per_program(D)
        fast(load_kernels("rms", __package__).rms_norm_fwd_kernel)[(-(-R // BR),)](
            x2, x2 if z2 is None else z2, weight.contiguous(), out, R,
            x2.stride(0), 0 if z2 is None else z2.stride(0), out.stride(0), float(eps),
            D=D, BD=next_pow2(D), BR=BR, GATED=z2 is not None, ZERO_CENTERED=zero_centered, L2=l2,
            num_warps=4 if next_pow2(D) <= TILE_ELEMENTS else 8,
        )  # fmt: skip
    return out.view(x.shape)
