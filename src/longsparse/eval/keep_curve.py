"""The accuracy-vs-keep curve: dense, the oracle, InfLLM-V2 (``sparse``) and SparDA at several budgets, on the same
RULER samples, with paired intervals against dense — the picture a user chooses a budget from.

A point is one (mode, top-k) run at one target length: its score, its keep ratio (share of the causal KV blocks a
decode step reads, the run's ``attention_keep``), its prefill keep ratio, and its paired bootstrap difference from
dense with the 95% interval. Runs are saved one file each (``<mode>-topk<k>.json`` in a runs folder), so that a curve
measured in several sittings (a GPU's time limit) is assembled from all of them; :func:`curve_result` builds the
result JSON and :func:`plot_curve` the figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..ops.sparse_attn.config import SparseAttentionConfig
from .attention_variants import AttentionVariant
from .report import RulerRun, length_label
from .sparse_quality import keep_summary

CURVE_MODES = ("dense", "oracle", "sparse", "sparda")


def run_name(mode: str, topk: int | None) -> str:
    """``dense`` or ``<mode>-topk<k>``: the name (and file stem) of a curve run."""
    return "dense" if mode == "dense" else f"{mode}-topk{topk}"


def curve_variants(
    modes: Sequence[str], topks: Sequence[int], base: SparseAttentionConfig, *, dense_layers: tuple[int, ...] = ()
) -> list[AttentionVariant]:
    """Dense once, then every block-sparse mode at every ``topk`` of ``base`` (its other fields as they are)."""
    unknown = [m for m in modes if m not in CURVE_MODES]
    if unknown:
        raise ValueError(f"modes must be among {', '.join(CURVE_MODES)}, got {unknown}")
    if not topks or any(not isinstance(k, int) or k <= 0 for k in topks):
        raise ValueError(f"topk values must be positive ints, got {list(topks)}")
    variants = [AttentionVariant("dense")] if "dense" in modes else []
    for k in topks:
        config = dataclasses.replace(base, topk=k)
        for mode in modes:
            if mode != "dense":
                variants.append(AttentionVariant(run_name(mode, k), mode, config, dense_layers=dense_layers))
    return variants


def curve_result(runs: Mapping[str, RulerRun], summary_topk: int, *, resamples: int = 20_000) -> dict:
    """``points`` (one per run and length, and over lengths: length ``"all"``) and ``summary``: the scores of
    dense, oracle, sparse and sparda at ``summary_topk``, ``keep_ratio`` (the sparse run's decode keep ratio),
    ``samples`` (paired samples per mode) and ``<mode>_minus_dense`` intervals, overall and ``per_length``."""
    if "dense" not in runs:
        raise ValueError(f"the curve needs the dense run, got {sorted(runs)}")
    compared = keep_summary(runs, "dense", resamples=resamples)
    points = []
    for name, entry in compared.items():
        mode, topk = _parse_name(name)
        for length, at in [("all", entry), *entry["per_length"].items()]:
            interval = at.get("minus_baseline", {"difference": 0.0, "low": 0.0, "high": 0.0})
            points.append({
                "mode": mode, "topk": topk, "length": length, "score": at["score"], "keep_ratio": at["keep_ratio"],
                "prefill_keep_ratio": at["prefill_keep_ratio"], "difference": interval["difference"],
                "low": interval["low"], "high": interval["high"],
            })  # fmt: skip
    summary: dict = {"dense_score": compared["dense"]["score"], "summary_topk": summary_topk}
    per_length: dict = {k: {"dense_score": v["score"]} for k, v in compared["dense"]["per_length"].items()}
    for mode in ("oracle", "sparse", "sparda"):
        name = run_name(mode, summary_topk)
        if name not in compared:
            continue
        entry = compared[name]
        summary[f"{mode}_score"] = entry["score"]
        summary[f"{mode}_minus_dense"] = entry["minus_baseline"]
        for k, at in entry["per_length"].items():
            per_length.setdefault(k, {}).update({
                f"{mode}_score": at["score"], f"{mode}_minus_dense": at["minus_baseline"],
                f"{mode}_keep_ratio": at["keep_ratio"],
            })  # fmt: skip
    keep_run = next(
        (run_name(m, summary_topk) for m in ("sparse", "sparda") if run_name(m, summary_topk) in compared), None
    )
    summary["keep_ratio"] = compared[keep_run]["keep_ratio"] if keep_run else None
    summary["samples"] = min(entry["samples"] for entry in compared.values())
    summary["per_length"] = per_length
    return {"summary": summary, "points": points, "runs": {n: r.config for n, r in runs.items()}}


def _parse_name(name: str) -> tuple[str, int | None]:
    if name == "dense":
        return "dense", None
    mode, sep, k = name.rpartition("-topk")
    if not sep or not k.isdigit():
        raise ValueError(f"{name!r} is not a curve run name (dense or <mode>-topk<k>)")
    return mode, int(k)


def plot_curve(path: str | Path, result: dict) -> Path:
    """Score against keep ratio, one panel per length: a line per block-sparse mode over its budgets with the paired
    95% interval as error bars (around dense's score plus the difference), dense as a horizontal line."""
    from ..reports.plot import pyplot, save_figure

    plt = pyplot()
    points = result["points"]
    lengths = sorted({p["length"] for p in points if p["length"] != "all"}, key=int)
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4.5), dpi=120, squeeze=False)
    for ax, length in zip(axes[0], lengths):
        at = [p for p in points if p["length"] == length]
        dense = next(p["score"] for p in at if p["mode"] == "dense")
        ax.axhline(dense, color="black", linestyle="--", label=f"dense {dense:.1f}")
        for mode in ("oracle", "sparse", "sparda"):
            mine = sorted((p for p in at if p["mode"] == mode and p["keep_ratio"] is not None),
                          key=lambda p: p["keep_ratio"])  # fmt: skip
            if not mine:
                continue
            xs = [p["keep_ratio"] for p in mine]
            ys = [dense + p["difference"] for p in mine]
            err = [[p["difference"] - p["low"] for p in mine], [p["high"] - p["difference"] for p in mine]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=mode)
            for p, x, y in zip(mine, xs, ys):
                ax.annotate(f"k{p['topk']}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
        ax.set(title=f"{length_label(int(length))}", xlabel="keep ratio (KV blocks read per decode step)",
               ylabel="RULER score (%)")  # fmt: skip
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("accuracy vs keep ratio (paired 95% intervals against dense)")
    return save_figure(fig, path)
