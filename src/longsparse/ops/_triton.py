"""How Triton kernels can run here: compiled on a GPU, in Triton's CPU interpreter, or not at all."""

from __future__ import annotations

import functools
import os

import torch

from .._optional import available

COMPILED = "compiled"
INTERPRETER = "interpreter"
UNAVAILABLE = "unavailable"


def interpreter_requested() -> bool:
    """True when ``TRITON_INTERPRET=1`` asks Triton to run kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def triton_mode() -> str:
    """One of ``"compiled"``, ``"interpreter"`` or ``"unavailable"``.

    The interpreter is chosen by the environment (``TRITON_INTERPRET=1``), which must be set before
    triton is imported; it runs kernels on CPU tensors, slowly, for tests. Every kernel call asks: whether a GPU is
    present is found once per process, whether triton is installed by a ``sys.modules`` lookup (``available``).
    """
    if not available("triton"):
        return UNAVAILABLE
    if interpreter_requested():
        return INTERPRETER
    return COMPILED if _has_gpu() else UNAVAILABLE


@functools.cache
def _has_gpu() -> bool:
    return torch.cuda.is_available()


def kernels_can_run_on(device: torch.device) -> bool:
    """True if a Triton kernel can take tensors on ``device`` in this process."""
    mode = triton_mode()
    if mode == INTERPRETER:
        return device.type == "cpu"
    return mode == COMPILED and device.type == "cuda"


def resolve_use_kernel(use_kernel: bool | None, device: torch.device) -> bool | None:
    """What a model-level caller passes the ops: ``use_kernel`` if set; else None (automatic: the Triton kernels) on
    CUDA and False (the torch references) elsewhere — also when Triton's CPU interpreter is on, which is for the ops'
    own tests, far too slow for whole models."""
    if use_kernel is not None:
        return use_kernel
    return None if device.type == "cuda" else False


def forward_kernel_choice(use_kernel: bool | None, *tensors: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> bool:
    """Whether a forward-only kernel runs on ``tensors`` (the first sets device and dtype): ``use_kernel`` if given,
    else where it can run — Triton available for that device, a dtype in ``dtypes``, and autograd not needing a
    backward (grad enabled and an input that requires grad), which such a kernel lacks. ``use_kernel=True`` where it
    cannot run is a ``ValueError`` saying why."""
    x = tensors[0]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    can = kernels_can_run_on(x.device) and x.dtype in dtypes and not needs_grad
    if use_kernel and not can:
        why = "autograd needs a backward, which the kernel lacks" if needs_grad else f"{x.device} with {x.dtype}"
        raise ValueError(f"use_kernel=True but the Triton kernel cannot run here: {why}")
    return can if use_kernel is None else use_kernel
