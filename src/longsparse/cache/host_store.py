"""Host memory for the offloaded blocks: a reusable (pinned) byte buffer and the row view the cache uses.

Pinning is slow — about 1.5 GB/s on the H200 host, 73 s for 112 GiB (DESIGN.md §7) — so a :class:`HostBuffer` is
allocated once, grown only when a larger cache asks for more, and handed to every cache built after it. Pinned memory
is page-locked host memory the GPU reads and writes directly (UVA); on a machine without CUDA the buffer is ordinary
memory and the same code runs on it.
"""

from __future__ import annotations

import torch


def pinning_available() -> bool:
    """Whether host memory can be pinned here (a CUDA device is present)."""
    return torch.cuda.is_available()


class HostBuffer:
    """A flat ``uint8`` host buffer that grows on demand and is otherwise reused.

    ``pin``: page-lock it (default: when CUDA is available). ``view(nbytes)`` returns the first ``nbytes`` bytes,
    reallocating (and re-pinning) only when the buffer is smaller; earlier views then keep the old memory alive.
    """

    def __init__(self, pin: bool | None = None):
        self.pin = pinning_available() if pin is None else bool(pin)
        if self.pin and not pinning_available():
            raise ValueError("pin=True needs CUDA: pinned host memory is page-locked for a GPU's direct access")
        self._buffer: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def view(self, nbytes: int) -> torch.Tensor:
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = None  # free the old buffer before pinning the new one
            self._buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=self.pin)
        return self._buffer[:nbytes]


def host_rows(buffer: torch.Tensor, rows: int, row_elems: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, row_elems]`` of ``dtype`` over the first bytes of a flat ``uint8`` host ``buffer``."""
    nbytes = rows * row_elems * dtype.itemsize
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.device.type != "cpu":
        raise ValueError(f"buffer must be a flat uint8 host tensor, got {buffer.dtype} {list(buffer.shape)} "
                         f"on {buffer.device}")  # fmt: skip
    if buffer.numel() < nbytes:
        raise ValueError(f"buffer holds {buffer.numel()} bytes, the host store needs {nbytes}")
    if buffer.data_ptr() % dtype.itemsize:
        raise ValueError(f"buffer is not aligned to {dtype.itemsize} bytes")
    return buffer[:nbytes].view(dtype).view(rows, row_elems)
