"""Benchmark results as JSON files with the environment that produced them.

Every file under ``benchmarks/results/<name>.json`` has: ``name``, ``environment`` (device, versions, date,
command, git commit), ``summary`` (named headline figures), ``rows`` (one dict per measured case) and ``notes``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..info import _version_of

PEER_MODULES = ("triton", "fla", "flash_qla", "tilelang", "transformers")


def environment(command: list[str] | None = None) -> dict:
    """Device name, library versions, UTC date, the command line and the git commit of the source tree."""
    device = (
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.processor() or 'unknown'})"
    )
    return {
        "device": device,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "versions": {m: _version_of(m) for m in PEER_MODULES},
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(command if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]),
        "git_commit": _git_commit(),
    }


GIT_COMMIT_ENV = "LONGSPARSE_GIT_COMMIT"
"""Where set, the commit a result records instead of asking git: for a copy of the tree whose git metadata is not
its own (a remote machine's copy of the working tree can carry a stale ``.git``)."""


def _git_commit() -> str | None:
    """Short HEAD commit, with ``+dirty`` when tracked files differ from it (the code measured is not that commit);
    :data:`GIT_COMMIT_ENV`'s value where that is set."""
    if os.environ.get(GIT_COMMIT_ENV):
        return os.environ[GIT_COMMIT_ENV]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if not commit:
        return None
    return commit + ("+dirty" if dirty.stdout.strip() else "")


@dataclass
class BenchmarkResult:
    """Rows of measurements plus named summary figures; ``save`` writes them with the environment."""

    name: str
    rows: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    environment: dict = field(default_factory=environment)

    def add(self, **row) -> dict:
        self.rows.append(row)
        return row

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "environment": self.environment,
            "summary": self.summary,
            "rows": self.rows,
            "notes": self.notes,
        }

    def save(self, directory: str | Path = "benchmarks/results") -> Path:
        path = Path(directory) / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_clean(self.to_dict()), indent=2) + "\n")
        return path


def _clean(x):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def load(path: str | Path) -> dict:
    """Read a result file and check that it has a ``summary`` object."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data.get("summary"), dict):
        raise ValueError(f"{path} has no 'summary' object")
    return data


class RowLog:
    """A :class:`BenchmarkResult` saved as it is measured: ``<directory>/<name>.json`` is rewritten whenever a row
    starts or :meth:`save` is called, so a crash or a timeout keeps every row finished by then (rows are dicts,
    filled in place). ``key``: the fields that identify a case; ``summarise(rows)`` recomputes the summary at each
    save.

    With ``append`` the rows and notes of an existing file are kept (its environment moves to
    ``environment["previous_runs"]``) and a row started with the same key values replaces the old one: several runs
    build one file."""

    def __init__(
        self,
        directory: str | Path,
        name: str,
        key: tuple[str, ...],
        summarise: Callable[[list[dict]], dict],
        append: bool = False,
    ):
        self.directory = Path(directory)
        self.key, self.summarise = key, summarise
        self.result = BenchmarkResult(name)
        path = self.directory / f"{name}.json"
        if append and path.exists():
            old = load(path)
            previous = dict(old.get("environment") or {})
            self.result.environment["previous_runs"] = previous.pop("previous_runs", []) + [previous]
            self.result.rows = list(old.get("rows", []))
            self.result.notes = list(old.get("notes", []))

    def note(self, text: str) -> None:
        if text not in self.result.notes:
            self.result.notes.append(text)

    def start(self, **fields) -> dict:
        """A new row holding ``fields`` (which must include the key fields) and the date of this run, saved at once."""
        missing = [k for k in self.key if k not in fields]
        if missing:
            raise ValueError(f"a row needs the key fields {missing}")
        wanted = tuple(fields[k] for k in self.key)
        self.result.rows = [r for r in self.result.rows if tuple(r.get(k) for k in self.key) != wanted]
        row = self.result.add(**fields, run=self.result.environment["date"])
        self.save()
        return row

    def save(self) -> Path:
        self.result.summary = self.summarise(self.result.rows)
        return self.result.save(self.directory)
