"""A RULER run's results: per-task / per-length table, JSON with a ``summary`` object, and a score-vs-length plot.

Aggregation follows RULER: a task's score at one length is the mean of its samples' scores times 100; a length's
score is the mean over tasks; the overall score is the mean over lengths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..reports.results import environment, load
from ..reports.tables import format_table
from .paired import Comparison, PairedDifference
from .runner import SampleResult
from .scoring import task_score


def length_label(tokens: int) -> str:
    """``4096 -> "4K"``; lengths that are not whole multiples of 1024 stay as numbers."""
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


@dataclass
class RulerRun:
    """One configuration evaluated on RULER samples: its configuration, per-sample records, and what was skipped."""

    name: str
    config: dict
    samples: list[dict]
    missing_tasks: dict[str, str] = field(default_factory=dict)
    environment: dict = field(default_factory=environment)

    @classmethod
    def from_results(cls, name: str, config: dict, results: Sequence[SampleResult], missing_tasks: Mapping) -> RulerRun:
        return cls(name, dict(config), [r.as_dict() for r in results], dict(missing_tasks))

    def scores(self) -> dict[str, dict[int, float]]:
        """``scores()[task][length]``: RULER's task score (percent), tasks and lengths in first-seen order."""
        grouped: dict[str, dict[int, list[float]]] = {}
        for r in self.samples:
            grouped.setdefault(r["task"], {}).setdefault(int(r["target_length"]), []).append(float(r["score"]))
        return {t: {k: task_score(v) for k, v in sorted(per.items())} for t, per in grouped.items()}

    def lengths(self) -> list[int]:
        return sorted({int(r["target_length"]) for r in self.samples})

    def summary(self) -> dict:
        """Overall score (percent), score per length, the mean GDN keep ratio over samples (``None`` when no sparse
        GDN layer ran), and what the numbers cover."""
        scores = self.scores()
        per_length = {}
        for k in self.lengths():
            at_k = [s[k] for s in scores.values() if k in s]
            per_length[str(k)] = sum(at_k) / len(at_k)
        overall = sum(per_length.values()) / len(per_length) if per_length else None
        kept = [float(r["keep_ratio"]) for r in self.samples if r.get("keep_ratio") is not None]
        return {
            "score": overall,
            "keep_ratio": sum(kept) / len(kept) if kept else None,
            "per_length": per_length,
            "tasks": list(scores),
            "lengths": self.lengths(),
            "num_samples": len(self.samples),
            "missing_tasks": sorted(self.missing_tasks),
        }

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": "ruler",
            "environment": self.environment,
            "config": self.config,
            "summary": self.summary(),
            "scores": {t: {str(k): v for k, v in per.items()} for t, per in self.scores().items()},
            "missing_tasks": self.missing_tasks,
            "samples": self.samples,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path


def load_run(path: str | Path) -> RulerRun:
    """Read a run written by ``RulerRun.save``."""
    data = load(path)
    if data.get("kind") != "ruler" or not isinstance(data.get("samples"), list):
        raise ValueError(f"{path} is not a RULER run (kind {data.get('kind')!r})")
    return RulerRun(data["name"], data["config"], data["samples"], data.get("missing_tasks", {}), data["environment"])


def format_scores(run: RulerRun) -> str:
    """Tasks as rows, lengths as columns, plus each task's mean over lengths and a per-length average row."""
    scores = run.scores()
    lengths = run.lengths()
    cols = [length_label(k) for k in lengths]
    rows = []
    for task, per in scores.items():
        row = {"task": task, **{length_label(k): v for k, v in per.items()}}
        row["mean"] = sum(per.values()) / len(per)
        rows.append(row)
    summary = run.summary()
    avg = {"task": "average", **{length_label(int(k)): v for k, v in summary["per_length"].items()}}
    avg["mean"] = summary["score"]
    rows.append(avg)
    text = format_table(rows, ["task", *cols, "mean"])
    for task, reason in run.missing_tasks.items():
        text += f"\n{task}: missing, not in the averages ({reason})"
    return text


def format_comparison(comparison: Comparison, label_a: str, label_b: str) -> str:
    """Per length, per task and overall: A, B, B − A and its paired bootstrap interval (percentage points)."""
    level = round(100 * comparison.overall.confidence)

    def row(name: str, d: PairedDifference) -> dict:
        return {
            "": name,
            label_a: d.a,
            label_b: d.b,
            "B - A": d.difference,
            f"{level}% low": d.low,
            f"{level}% high": d.high,
            "samples": d.samples,
        }

    rows = [row(length_label(k), d) for k, d in comparison.per_length.items()]
    rows += [row(t, d) for t, d in comparison.per_task.items()]
    rows.append(row("overall", comparison.overall))
    cols = ["", label_a, label_b, "B - A", f"{level}% low", f"{level}% high", "samples"]
    note = (
        f"B = {label_b}, A = {label_a}; paired bootstrap over samples, stratified by task and length, "
        f"{comparison.overall.resamples} resamples, percentile interval"
    )
    return format_table(rows, cols) + "\n" + note


def plot_scores(path: str | Path, runs: Mapping[str, RulerRun]) -> Path:
    """Score vs target length: one line per task and an average line, for each run (label: run)."""
    from ..reports.plot import line_plot

    lengths = sorted({k for run in runs.values() for k in run.lengths()})
    series: dict[str, list[float | None]] = {}
    for label, run in runs.items():
        prefix = f"{label}: " if len(runs) > 1 else ""
        for task, per in run.scores().items():
            series[prefix + task] = [per.get(k) for k in lengths]
        per_length = run.summary()["per_length"]
        series[prefix + "average"] = [per_length.get(str(k)) for k in lengths]
    names = " vs ".join(runs)
    return line_plot(
        path,
        lengths,
        series,
        title=f"RULER: {names}",
        xlabel="target length (tokens)",
        ylabel="score (%)",
        logy=False,
        xticklabels=[length_label(k) for k in lengths],
    )
