"""Host-side launch helpers shared by the sparse-attention ops: kernel modules, tile sizes, memory layout."""

from __future__ import annotations

import importlib

import torch

from ..._optional import require


def load_kernels(name: str, package: str = __package__):
    """The Triton kernel module ``<package>.kernels.<name>`` (default: this package's); triton is optional, so an
    ImportError names the extra."""
    require("triton", f"the {package.rsplit('.', 1)[-1]} kernels")
    return importlib.import_module(f"{package}.kernels.{name}")


def next_pow2(x: int) -> int:
    """Smallest power of two ``>= x`` (1 for ``x <= 1``): Triton tile extents must be powers of two."""
    return 1 << max(0, (x - 1).bit_length())


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself if its last dim is contiguous (16-byte vector loads), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()
