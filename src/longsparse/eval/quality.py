"""Several configurations evaluated on the same RULER samples, side by side against one baseline: one JSON object
with each run's score per length, each run's difference from the baseline with its paired bootstrap interval, and
the GDN keep ratios (what ``benchmarks/results/quality_gdn.json`` holds: dense vs SparseGDN vs random selection).
"""

from __future__ import annotations

from collections.abc import Mapping

from .paired import DEFAULT_RESAMPLES, compare_records
from .report import RulerRun


def keep_ratio_by_length(run: RulerRun) -> dict[str, float | None]:
    """Mean per-sample GDN keep ratio at each target length (``None`` where no sample has one)."""
    out: dict[str, float | None] = {}
    for length in run.lengths():
        kept = [
            float(r["keep_ratio"])
            for r in run.samples
            if int(r["target_length"]) == length and r.get("keep_ratio") is not None
        ]
        out[str(length)] = sum(kept) / len(kept) if kept else None
    return out


def common_samples(runs: Mapping[str, RulerRun]) -> dict[str, RulerRun]:
    """``runs`` restricted to the samples every one of them holds (by sample id), so that runs of different sizes on
    one seed (``--samples 3`` and ``--samples 10`` share their first three samples per task and length) can be paired.
    A shared id whose prompt differs between runs (another seed, template or tokenizer) raises ValueError; so does
    an empty intersection."""
    ids = None
    for run in runs.values():
        run_ids = {r["id"] for r in run.samples}
        ids = run_ids if ids is None else ids & run_ids
    if not ids:
        raise ValueError(f"the runs {list(runs)} share no sample")
    prompts: dict[str, tuple[str, str]] = {}
    for label, run in runs.items():
        for r in run.samples:
            if r["id"] in ids:
                first = prompts.setdefault(r["id"], (label, r["prompt_sha1"]))
                if first[1] != r["prompt_sha1"]:
                    raise ValueError(f"sample {r['id']} has different prompts in runs {first[0]!r} and {label!r}")
    return {
        label: RulerRun(
            run.name, run.config, [r for r in run.samples if r["id"] in ids], run.missing_tasks, run.environment
        )  # fmt: skip
        for label, run in runs.items()
    }


def side_by_side(
    runs: Mapping[str, RulerRun],
    baseline: str,
    *,
    keep_ratio_of: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """``runs`` (label -> run, all on the same samples) compared with ``runs[baseline]``.

    ``summary`` holds ``<label>_score`` (percent) for every run, ``<label>_minus_<baseline>`` (difference in
    percentage points with its interval) for every other run, ``<label>_keep_ratio`` for runs with sparse GDN layers,
    and ``keep_ratio``: that of run ``keep_ratio_of`` (default: the first run that has one)."""
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(runs)}")
    if len(runs) < 2:
        raise ValueError("side_by_side needs at least two runs")
    base = runs[baseline]
    kw = dict(resamples=resamples, confidence=confidence, seed=seed)
    comparisons = {
        label: compare_records(base.samples, run.samples, **kw) for label, run in runs.items() if label != baseline
    }
    summary: dict = {f"{label}_score": run.summary()["score"] for label, run in runs.items()}
    for label, c in comparisons.items():
        summary[f"{label}_minus_{baseline}"] = _interval(c.overall)
    keep = {label: run.summary()["keep_ratio"] for label, run in runs.items()}
    for label, value in keep.items():
        if value is not None:
            summary[f"{label}_keep_ratio"] = value
    if keep_ratio_of is not None and keep_ratio_of not in runs:
        raise ValueError(f"keep_ratio_of {keep_ratio_of!r} is not one of the runs {list(runs)}")
    chosen = keep_ratio_of or next((label for label, v in keep.items() if v is not None), None)
    summary["keep_ratio"] = keep[chosen] if chosen is not None else None
    per_length = {}
    for length in base.lengths():
        key = str(length)
        entry: dict = {f"{label}_score": run.summary()["per_length"].get(key) for label, run in runs.items()}
        for label, c in comparisons.items():
            entry[f"{label}_minus_{baseline}"] = _interval(c.per_length[length])
        for label, run in runs.items():
            if keep[label] is not None:
                entry[f"{label}_keep_ratio"] = keep_ratio_by_length(run)[key]
        per_length[key] = entry
    return {
        "summary": summary,
        "per_length": per_length,
        "comparisons": {f"{label}_vs_{baseline}": c.as_dict() for label, c in comparisons.items()},
        "runs": {label: {"name": r.name, "config": r.config, "summary": r.summary()} for label, r in runs.items()},
        "bootstrap": {"resamples": resamples, "confidence": confidence, "seed": seed},
    }


def _interval(d) -> dict:
    return {"difference": d.difference, "low": d.low, "high": d.high, "samples": d.samples}
