"""How Triton kernels can run here: compiled on a GPU, in Triton's CPU interpreter, or not at all."""

from __future__ import annotations

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
    triton is imported; it runs kernels on CPU tensors, slowly, for tests.
    """
    if not available("triton"):
        return UNAVAILABLE
    if interpreter_requested():
        return INTERPRETER
    if torch.cuda.is_available():
        return COMPILED
    return UNAVAILABLE


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
