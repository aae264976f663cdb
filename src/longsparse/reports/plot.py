"""Plot helpers for benchmark figures (matplotlib, imported lazily, drawn off-screen)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .._optional import require


def pyplot():
    """matplotlib's pyplot on the off-screen Agg backend (matplotlib imported on first use)."""
    mpl = require("matplotlib", "plotting benchmark results")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def line_plot(
    path: str | Path,
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = True,
    xticklabels: Sequence[str] | None = None,
) -> Path:
    """One line per series against ``x``; missing points (None) are left out. Returns the written path."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, ys in series.items():
        pts = [(xi, yi) for xi, yi in zip(x, ys) if yi is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if xticklabels is not None:
        ax.set_xticks(list(x), list(xticklabels))
        ax.minorticks_off()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def panel_plot(
    path: str | Path,
    x: Sequence[float],
    panels: Mapping[str, Mapping[str, Sequence[float | None]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Side-by-side panels (one per entry of ``panels``, e.g. a context length), each with one line per series
    against ``x`` (log2 x, log y); missing points (None) are left out, and a series keeps its colour in every panel.
    Returns the written path."""
    plt = pyplot()
    from matplotlib import ticker

    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6 * max(1, len(panels)), 4.5), dpi=120, squeeze=False)
    labels = dict.fromkeys(label for series in panels.values() for label in series)
    colour = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for ax, (name, series) in zip(axes[0], panels.items()):
        for label, ys in series.items():
            pts = [(xi, yi) for xi, yi in zip(x, ys) if yi is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, color=colour[label])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(x), [str(v) for v in x])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        values = [y for ys in series.values() for y in ys if y is not None and y > 0]
        if values and max(values) < 100 * min(values):  # under two decades: label the 2, 3, 5… ticks, plainly
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:e}"[0] in "235" else ""))
        ax.set(title=name, xlabel=xlabel, ylabel=ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def stacked_bars(
    path: str | Path,
    groups: Sequence[str],
    components: Mapping[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
) -> Path:
    """Stacked bars: one bar per group (e.g. "32K dense"), one colour per component (e.g. "attention")."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(groups)), 4.5), dpi=120)
    bottom = [0.0] * len(groups)
    for label, values in components.items():
        ax.bar(groups, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(title=title, ylabel=ylabel)
    ax.tick_params(axis="x", rotation=45)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the bars, never over them
    return save_figure(fig, path)


def save_figure(fig, path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (folders made) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
