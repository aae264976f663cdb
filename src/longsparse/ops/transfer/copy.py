"""Row copies by index lists between host memory and GPU slots (the prefetch and the write-back of filled blocks).

A *row* is one block's keys and values of one KV head (``2 · block · d`` elements, 32 KiB in bf16 for MiniCPM4's
block 64 and d = 128), contiguous in both the pinned host store and the GPU slot buffer, so each task is one
contiguous run. On a GPU the persistent kernel of ``kernels/copy.py`` runs with ``num_ctas`` programs and reads (or
writes) pinned host memory in place through UVA: no staging copy, no host-side gather, and no host sync — the task
count comes from device memory. The CTA quota trades copy bandwidth against the multiprocessors that attention and
the FFN need while the copy overlaps them (SparDA (Fu et al., arXiv:2606.04511) Sec. 4.3, Table 7).
"""

from __future__ import annotations

import torch

from .._launch import fast
from .._triton import kernels_can_run_on
from ..sparse_attn.checks import check_tensor, shape_str
from ..sparse_attn.launch import load_kernels, next_pow2
from .naive import copy_rows_ref

MAX_CHUNK_WORDS = 8192
"""Words (32-bit) one program moves per iteration: a whole 32 KiB row of MiniCPM4's geometry in one go."""


def default_cta_quota(batch_size: int) -> int:
    """Programs of the persistent copy kernel for a decode batch of ``batch_size`` sequences.

    The paper's H100 rule (16 below batch 32, else 32; SparDA Table 7), kept for the H200 after
    measuring it there (`longsparse bench decode`, ``cta_sweep_tokens_per_s`` in ``benchmarks/results/decode.json``):
    the gather runs at the PCIe ceiling with 16, 32 or 132 programs alike (46 GB/s on scattered 32 KiB rows against
    55 GB/s for one bulk copy), and 32 programs instead of 16 moved decode throughput by under 1 % at batches 16 and
    32 (32K and 128K).
    """
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return 16 if batch_size < 32 else 32


def _word_view(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x [R, E]`` with contiguous rows, as ``[R, words]`` of the widest integer type (32, 16 or 8 bits) that
    divides a row's bytes: the kernel moves bits, whatever the dtype."""
    if x.stride(-1) != 1 or (x.shape[0] > 1 and x.stride(0) != x.shape[1]):
        raise ValueError(f"{name} must have contiguous rows [R, E], got shape {shape_str(x)}, strides {x.stride()}")
    nbytes = x.shape[1] * x.element_size()
    offset = x.storage_offset() * x.element_size()
    for dtype in (torch.int32, torch.int16, torch.uint8):
        if nbytes % dtype.itemsize == 0 and offset % dtype.itemsize == 0:
            return x.view(dtype)
    raise AssertionError("unreachable: every row is a whole number of bytes")


def _check_placement(src: torch.Tensor, dst: torch.Tensor, index_device: torch.device) -> None:
    """On a GPU: indices on the GPU, one side on the GPU and the other there or in pinned host memory."""
    if index_device.type != "cuda":
        if src.device != index_device or dst.device != index_device:
            raise ValueError(
                f"src, dst and the row indices must share one device, got {src.device}, {dst.device}, {index_device}"
            )
        return
    for name, x in (("src", src), ("dst", dst)):
        if x.device != index_device and not (x.device.type == "cpu" and x.is_pinned()):
            raise ValueError(
                f"{name} must be on {index_device} or in pinned host memory (the kernel reads it through UVA), "
                f"got {x.device}{'' if x.device.type != 'cpu' else ' (not pinned)'}"
            )


def copy_rows(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_rows: torch.Tensor,
    dst_rows: torch.Tensor,
    count: torch.Tensor | None = None,
    *,
    num_ctas: int = 16,
    use_kernel: bool | None = None,
) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for ``i < count``, bit for bit (no host sync on a GPU).

    ``src [Rs, E]`` and ``dst [Rd, E]``: one dtype, rows contiguous; on a GPU either may live in pinned host memory.
    ``src_rows``, ``dst_rows [M]`` integer row indices (``dst_rows`` without repeats) on the kernel's device;
    ``count``: a one-element int32 tensor there (default: all ``M``). ``num_ctas``: programs of the persistent
    kernel. ``use_kernel``: None = the Triton kernel when it can run, else :func:`copy_rows_ref`.
    """
    for name, x, dims, layout in (
        ("src", src, 2, "[Rs, E]"),
        ("dst", dst, 2, "[Rd, E]"),
        ("src_rows", src_rows, 1, "[M]"),
        ("dst_rows", dst_rows, 1, "[M]"),
    ):
        if not isinstance(x, torch.Tensor) or x.dim() != dims:
            got = shape_str(x) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a {dims}-D tensor {layout}, got {got}")
    for name, x in (("src_rows", src_rows), ("dst_rows", dst_rows)):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got dtype {x.dtype}")
    if src.dtype != dst.dtype or src.shape[1] != dst.shape[1]:
        raise ValueError(
            f"src and dst must share dtype and row width, got {src.dtype} {shape_str(src)} and "
            f"{dst.dtype} {shape_str(dst)}"
        )
    if src_rows.shape != dst_rows.shape or src_rows.device != dst_rows.device:
        raise ValueError(
            f"src_rows and dst_rows must have one shape and device, got {shape_str(src_rows)} on {src_rows.device} "
            f"and {shape_str(dst_rows)} on {dst_rows.device}"
        )
    if count is not None:
        check_tensor("count", count, 1, "[1]", floating=False)
        if count.shape != (1,) or count.device != src_rows.device:
            raise ValueError(
                f"count must be a one-element tensor on {src_rows.device}, got {shape_str(count)} on {count.device}"
            )
    if not isinstance(num_ctas, int) or num_ctas <= 0:
        raise ValueError(f"num_ctas must be a positive int, got {num_ctas!r}")
    device = src_rows.device
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _check_placement(src, dst, device)  # asks the driver about pointers: not while a CUDA graph is captured
    can = kernels_can_run_on(device)
    if use_kernel and not can:
        raise ValueError(f"use_kernel=True but Triton kernels cannot run on device {device} (see `longsparse info`)")
    if not (can if use_kernel is None else use_kernel):
        copy_rows_ref(src, dst, src_rows, dst_rows, count)
        return
    if count is None:
        count = torch.full((1,), src_rows.shape[0], dtype=torch.int32, device=device)
    if src_rows.shape[0] == 0 or src.shape[1] == 0:
        return
    src_w, dst_w = _word_view(src, "src"), _word_view(dst, "dst")
    row = src_w.shape[1]
    chunk = min(next_pow2(row), MAX_CHUNK_WORDS)
    fast(load_kernels("copy", __package__).copy_fwd_kernel_rows)[(num_ctas,)](
        src_w, dst_w, src_rows, dst_rows, count, ROW=row, CHUNK=chunk, NCTA=num_ctas,
        num_warps=8 if chunk >= 4096 else 4,
    )  # fmt: skip
