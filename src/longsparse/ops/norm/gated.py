"""The gated RMS norm's entry point: argument checks and the Triton launch."""

from __future__ import annotations

import torch

from .._triton import kernels_can_run_on
from ..sparse_attn.checks import shape_str
from ..sparse_attn.launch import load_kernels, next_pow2
from .naive import gated_rms_norm_ref

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROWS_PER_PROGRAM = 16


def gated_rms_norm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, *, use_kernel: bool | None = None
) -> torch.Tensor:
    """``w · x̂ · silu(z)`` over the last dim of ``x, z [..., D]`` (``weight [D]``), in ``x``'s dtype.

    ``use_kernel``: None runs the Triton kernel where it can (a GPU, or Triton's interpreter for CPU tensors) and
    autograd does not need a backward (the kernel has none); True requires it; False runs the torch reference.
    """
    for name, t in (("x", x), ("z", z), ("weight", weight)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor")
    if x.dim() < 1 or z.shape != x.shape:
        raise ValueError(f"x and z must have one shape [..., D], got x {shape_str(x)} and z {shape_str(z)}")
    D = x.shape[-1]
    if weight.shape != (D,):
        raise ValueError(f"weight must be [D] = [{D}], got {shape_str(weight)}")
    if not (x.device == z.device == weight.device):
        raise ValueError(f"x, z and weight must share a device, got {x.device}, {z.device}, {weight.device}")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, z, weight))
    can = kernels_can_run_on(x.device) and x.dtype in KERNEL_DTYPES and not needs_grad
    if use_kernel and not can:
        why = "autograd needs a backward, which the kernel lacks" if needs_grad else f"{x.device} with {x.dtype}"
        raise ValueError(f"use_kernel=True but the Triton kernel cannot run here: {why}")
    if not (can if use_kernel is None else use_kernel):
        return gated_rms_norm_ref(x, z, weight, eps)
    x2, z2 = x.reshape(-1, D), z.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if z2.stride(-1) != 1:
        z2 = z2.contiguous()
    R = x2.shape[0]
    out = torch.empty(R, D, dtype=x.dtype, device=x.device)
    if R and D:
        load_kernels("gated", __package__).gated_rms_norm_fwd_kernel[(-(-R // ROWS_PER_PROGRAM),)](
            x2, z2, weight.contiguous(), out, R, x2.stride(0), z2.stride(0), out.stride(0), float(eps),
            D=D, BD=next_pow2(D), BR=ROWS_PER_PROGRAM, num_warps=4,
        )  # fmt: skip
    return out.view(x.shape)
