"""Input validation for every sparse-attention entry point: ValueErrors that name the argument and what is wrong."""

from __future__ import annotations

import torch

from .._triton import kernels_can_run_on

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def shape_str(x: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in x.shape) + "]"


def check_tensor(name: str, x, dim: int, layout: str, *, floating: bool = True) -> torch.Tensor:
    """``x`` is a tensor of ``dim`` dims (``layout`` names them), floating point or integer as asked."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if x.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D {layout}, got shape {shape_str(x)}")
    if floating and x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if not floating and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise ValueError(f"{name} must be an integer tensor, got dtype {x.dtype}")
    return x


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    named = {n: t for n, t in tensors.items() if t is not None}
    devices = {t.device for t in named.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{n} on {t.device}" for n, t in named.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    return next(iter(devices))


def check_gqa(q_heads: int, kv_heads: int, q_name: str = "q", kv_name: str = "k") -> int:
    """Query heads per KV head; raises unless ``q_heads`` is a positive multiple of ``kv_heads``."""
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"{q_name} heads ({q_heads}) must be a multiple of {kv_name} heads ({kv_heads})")
    return q_heads // kv_heads


def check_cu_seqlens(cu_seqlens, B: int, T: int) -> list[int] | None:
    """Validate packed offsets ``[0, ..., T]`` (needs ``B == 1``) and return them as Python ints (reads the device)."""
    if cu_seqlens is None:
        return None
    check_tensor("cu_seqlens", cu_seqlens, 1, "[N + 1]", floating=False)
    if B != 1:
        raise ValueError(f"cu_seqlens requires batch size 1 (sequences packed along T), got B={B}")
    offsets = [int(x) for x in cu_seqlens.tolist()]
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != T:
        raise ValueError(f"cu_seqlens must run from 0 to T={T}, got {offsets}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {offsets}")
    return offsets


def use_kernels(device: torch.device, dtype: torch.dtype, use_kernel: bool | None) -> bool:
    """Whether to run the Triton kernels: ``use_kernel`` if given (error if impossible), else when they can run."""
    can = kernels_can_run_on(device) and dtype in KERNEL_DTYPES
    if use_kernel and not can:
        why = f"dtype {dtype}" if dtype not in KERNEL_DTYPES else f"device {device} (see `longsparse info`)"
        raise ValueError(f"use_kernel=True but Triton kernels cannot run on {why}")
    return can if use_kernel is None else use_kernel


def check_compression(kernel_size, kernel_stride) -> None:
    """A compression window of ``kernel_size`` tokens every ``kernel_stride`` tokens (a multiple of it)."""
    for name, value in (("kernel_size", kernel_size), ("kernel_stride", kernel_stride)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if kernel_size % kernel_stride:
        raise ValueError(f"kernel_size={kernel_size} must be a multiple of kernel_stride={kernel_stride}")
