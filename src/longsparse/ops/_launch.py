"""Launch compiled Triton kernels without the JIT's per-call binding: the host cost of a launch, not the kernel.

``kernel[grid](*args, **kwargs)`` on a ``triton.jit`` function binds the arguments to the signature, specialises
each one, builds a cache key from them and the options, looks the compiled kernel up, checks the globals it read and
only then launches. On the H200's host (Triton 3.6) an empty kernel of 12 arguments takes ~16–20 µs, and in a
SparseGDN call at 16K the JIT's ``run`` was about half of the call's host time for six launches of 20–30 arguments
each, while the selector's kernels run for 3–10 µs: at 4K–32K tokens a SparseGDN call waits for its host, not its
kernels. :class:`FastLaunch` keeps, per specialisation, the compiled kernel that the JIT's first launch returned, and
later launches call it directly (``CompiledKernel[grid](*all_args)``, the launcher the JIT itself ends in).

What a specialisation is, here: the value of every constexpr parameter and launch option (``num_warps`` …), and for
every other argument what Triton's specialisation can depend on — a tensor's dtype and whether its address is a
multiple of 16, an integer's range (i32 / i64 / u64) and whether it is 1 or a multiple of 16, a float by type, a
bool by value, a TMA descriptor's dtype, block shape, layout and padding (and its shape and strides as integers).
That key is at least as fine as the JIT's own, so a launch never runs a kernel compiled for other arguments; where
it is finer the JIT's cache serves the first launch and only this table grows (bounded:
:data:`MAX_SPECIALISATIONS`). The current CUDA device is part of the key: a compiled kernel is loaded per device.

In Triton's CPU interpreter (and wherever a launch returns no compiled kernel) every launch goes through the JIT, as
it does everywhere with ``LONGSPARSE_FAST_LAUNCH=0`` in the environment (read as each kernel is first launched).
Changing Triton's debug or instrumentation knobs after a kernel's first launch is not seen by the fast path.
"""

from __future__ import annotations

import os
from typing import Any

import torch

MAX_SPECIALISATIONS = 64
"""Compiled kernels one :class:`FastLaunch` keeps; past that the table starts over (the JIT's cache still holds
them, so a dropped entry costs one slow launch)."""

_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)


def _int_key(x: int) -> tuple:
    width = 32 if _I32[0] <= x <= _I32[1] else (64 if _I64[0] <= x <= _I64[1] else 65)
    return width, x == 1, x % 16 == 0


def _arg_key(x: Any):
    """What Triton's specialisation of a runtime argument ``x`` can depend on (module docstring)."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    if isinstance(x, bool):  # by value: finer than the JIT's i1, never coarser
        return bool, x
    if isinstance(x, int):
        return _int_key(x)
    if isinstance(x, float):
        return float
    if x is None:
        return None
    base = getattr(x, "base", None)
    if isinstance(base, torch.Tensor) and hasattr(x, "block_shape"):  # a host TMA descriptor (Triton or Gluon)
        dims = tuple(_int_key(int(s)) for s in (*x.shape, *x.strides))
        layout = getattr(x, "layout", None)
        return type(x), base.dtype, tuple(x.block_shape), layout, getattr(x, "padding", None), dims
    raise TypeError(f"FastLaunch: no specialisation key for an argument of type {type(x).__name__}")


class FastLaunch:
    """``FastLaunch(kernel)[grid](*args, **kwargs)`` launches ``kernel`` (a ``triton.jit`` or ``gluon.jit``
    function) as ``kernel[grid](*args, **kwargs)`` does, through the compiled kernel kept for the arguments'
    specialisation after the first launch (module docstring). ``grid`` is a tuple of ints (not a callable)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled: dict[tuple, Any] = {}
        # Triton's CPU interpreter swaps triton.jit for a function without compiled kernels: no fast path there
        self._fast = hasattr(kernel, "device_caches") and os.environ.get("LONGSPARSE_FAST_LAUNCH", "1") != "0"
        if not self._fast:
            return
        self._names = list(kernel.arg_names)
        self._positions = set(self._names)
        self._constexpr = {kernel.arg_names[i] for i in kernel.constexprs}
        params = kernel.signature.parameters.items()
        self._defaults = {name: p.default for name, p in params if p.default is not p.empty}

    @property
    def specialisations(self) -> int:
        """Compiled kernels kept (one per specialisation launched since the table last started over)."""
        return len(self._compiled)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            return self.run(grid, args, kwargs)

        return launch

    def _key(self, args: tuple, kwargs: dict) -> tuple:
        names = self._names
        constexpr = self._constexpr
        key = [torch.cuda.current_device()]
        for name, x in zip(names, args):
            key.append(x if name in constexpr else _arg_key(x))
        for name, x in kwargs.items():  # constexprs and launch options (num_warps …) by value
            key.append((name, x if name in constexpr or name not in self._positions else _arg_key(x)))
        return tuple(key)

    def _all_args(self, args: tuple, kwargs: dict) -> list:
        """Every parameter's value in signature order (the compiled launcher skips the constexpr ones itself)."""
        rest = self._names[len(args) :]
        missing = [n for n in rest if n not in kwargs and n not in self._defaults]
        if missing:
            raise TypeError(f"{getattr(self.kernel, '__name__', self.kernel)}: missing arguments {missing}")
        return [*args, *(kwargs[n] if n in kwargs else self._defaults[n] for n in rest)]

    def run(self, grid: tuple, args: tuple, kwargs: dict):
        if not self._fast:
            return self.kernel[grid](*args, **kwargs)
        key = self._key(args, kwargs)
        try:
            compiled = self._compiled.get(key)
        except TypeError:  # an unhashable constexpr: the JIT's own path, every time
            return self.kernel[grid](*args, **kwargs)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if compiled is not None and hasattr(compiled, "run"):
                if len(self._compiled) >= MAX_SPECIALISATIONS:
                    self._compiled.clear()
                self._compiled[key] = compiled
            return compiled
        grid = tuple(grid) + (1,) * (3 - len(grid))
        compiled[grid](*self._all_args(args, kwargs))
        return compiled


_KEPT: dict[int, FastLaunch] = {}


def fast(kernel) -> FastLaunch:
    """The :class:`FastLaunch` of ``kernel``, one per kernel for the life of the process (as Triton keeps its
    compiled kernels): ``fast(kernel)[grid](*args, **kwargs)`` in place of ``kernel[grid](*args, **kwargs)``."""
    kept = _KEPT.get(id(kernel))
    if kept is None or kept.kernel is not kernel:
        kept = _KEPT[id(kernel)] = FastLaunch(kernel)
    return kept
