"""Training checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint holds the step reached, the projections' float32 weights, the optimizer state, the training config
(as a dict) and the metric history. Data and position draws depend only on ``(seed, step)`` (see
:mod:`longsparse.tasks.streams`), so no random state is saved. Files are written to a temporary name and renamed, so a
run killed mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` (``step``, ``projections``, ``optimizer``, ``config``, ``history``) atomically to ``path``."""
    missing = {"step", "projections", "optimizer", "config", "history"} - set(state)
    if missing:
        raise ValueError(f"a checkpoint needs {sorted(missing)} as well")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (onto the CPU)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"{path} is not a forecast training checkpoint")
    return state
