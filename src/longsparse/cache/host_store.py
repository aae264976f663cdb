"""Host memory for the offloaded blocks: a reusable (pinned) byte buffer and the row view the cache uses.

Pinning is slow — about 1.5 GB/s on the H200 host, 73 s for 112 GiB — so a :class:`HostBuffer` is
allocated once, grown only when a larger cache asks for more, and handed to every cache built after it. Pinned memory
is page-locked host memory the GPU reads and writes directly (UVA); on a machine without CUDA the buffer is ordinary
memory and the same code runs on it.

Pinning registers an ordinary allocation with ``cudaHostRegister`` in 1 GiB pieces from several threads (the driver
pins pieces in parallel), rather than through torch's pinned allocator, which rounds every request up to a power of
two (a 70 GiB store would ask for 128 GiB). The registration is undone when the last view of the buffer goes away.
"""

from __future__ import annotations

import os
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

PAGE = 4096
PIN_CHUNK = 1 << 30


def pinning_available() -> bool:
    """Whether host memory can be pinned here (a CUDA device is present)."""
    return torch.cuda.is_available()


def _unregister(pointers: list[int]) -> None:
    cudart = torch.cuda.cudart()
    for p in pointers:
        cudart.cudaHostUnregister(p)


def _pinned_bytes(nbytes: int, threads: int) -> torch.Tensor:
    """``nbytes`` of page-aligned host memory, registered with CUDA in parallel pieces (see the module docstring)."""
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    offset = (-raw.ctypes.data) % PAGE
    array = raw[offset : offset + nbytes]
    base = array.ctypes.data
    pieces = [(base + start, min(PIN_CHUNK, nbytes - start)) for start in range(0, nbytes, PIN_CHUNK)]
    cudart = torch.cuda.cudart()
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(pieces)))) as pool:
        codes = list(pool.map(lambda piece: int(cudart.cudaHostRegister(piece[0], piece[1], 0)), pieces))
    pinned = [p for (p, _), code in zip(pieces, codes) if code == 0]
    if len(pinned) != len(pieces):
        _unregister(pinned)
        failed = next(code for code in codes if code != 0)
        raise RuntimeError(
            f"pinning {nbytes / 2**30:.1f} GiB of host memory failed (cudaHostRegister error {failed}): the host "
            "may not allow locking that much memory"
        )
    weakref.finalize(raw, _unregister, pinned)  # runs when the last tensor viewing the memory is freed
    return torch.from_numpy(array)


class HostBuffer:
    """A flat ``uint8`` host buffer that grows on demand and is otherwise reused.

    ``pin``: page-lock it (default: when CUDA is available); ``pin_threads``: threads that register it. ``view(n)``
    returns the first ``n`` bytes, reallocating (and re-pinning) only when the buffer is smaller; views taken
    earlier keep the old memory (and its registration) alive until they are dropped.
    """

    def __init__(self, pin: bool | None = None, pin_threads: int | None = None):
        self.pin = pinning_available() if pin is None else bool(pin)
        if self.pin and not pinning_available():
            raise ValueError("pin=True needs CUDA: pinned host memory is page-locked for a GPU's direct access")
        self.pin_threads = pin_threads or min(16, os.cpu_count() or 1)
        self._buffer: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def view(self, nbytes: int) -> torch.Tensor:
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = None  # drop this reference before allocating the larger buffer
            size = max(nbytes, 1)
            self._buffer = _pinned_bytes(size, self.pin_threads) if self.pin else torch.empty(size, dtype=torch.uint8)
        return self._buffer[:nbytes]


def host_rows(buffer: torch.Tensor, rows: int, row_elems: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, row_elems]`` of ``dtype`` over the first bytes of a flat ``uint8`` host ``buffer``."""
    nbytes = rows * row_elems * dtype.itemsize
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.device.type != "cpu":
        raise ValueError(
            f"buffer must be a flat uint8 host tensor, got {buffer.dtype} {list(buffer.shape)} on {buffer.device}"
        )
    if buffer.numel() < nbytes:
        raise ValueError(f"buffer holds {buffer.numel()} bytes, the host store needs {nbytes}")
    if buffer.data_ptr() % dtype.itemsize:
        raise ValueError(f"buffer is not aligned to {dtype.itemsize} bytes")
    return buffer[:nbytes].view(dtype).view(rows, row_elems)
