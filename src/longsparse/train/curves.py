"""Training curves of hybrid runs: ``train_log.jsonl`` files read back and drawn side by side (LM loss, copy rows'
loss, answer loss and held-out accuracy against tokens seen), so that runs of different recipes or lengths compare at
a glance.

    python -m longsparse.train.curves run1=runs/a/train_log.jsonl run2=runs/b/train_log.jsonl --out curves.png
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainLog:
    """One run's log: per logged step its tokens seen and loss terms (``None`` where a step had no such tokens), and
    per held-out evaluation the tokens seen and, at each row length, the mean exact match and the share of answer
    tokens right (0-1; logs older than the token accuracy have none)."""

    tokens: list[int] = field(default_factory=list)
    lm_loss: list[float | None] = field(default_factory=list)
    answer_loss: list[float | None] = field(default_factory=list)
    copy_loss: list[float | None] = field(default_factory=list)
    eval_tokens: list[int] = field(default_factory=list)
    exact_match: dict[int, list[float]] = field(default_factory=dict)
    token_accuracy: dict[int, list[float]] = field(default_factory=dict)


def read_log(path: str | Path) -> TrainLog:
    """Parse ``train_log.jsonl``. A step logged twice (a run resumed from an earlier checkpoint) keeps its last
    record; evaluations are placed at the tokens of their step."""
    steps: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if "held_out_exact_match" in record:
            evals[int(record["step"])] = record
        elif "loss" in record:
            steps[int(record["step"])] = record
    if not steps:
        raise ValueError(f"{path} has no logged training step")
    log = TrainLog()
    for step in sorted(steps):
        log.tokens.append(int(steps[step]["tokens"]))
        log.lm_loss.append(steps[step].get("lm_loss"))
        log.answer_loss.append(steps[step].get("answer_loss"))
        log.copy_loss.append(steps[step].get("copy_loss"))  # logs before copy rows have none
    last = max(steps)
    per_step = steps[last]["tokens"] / last
    for step in sorted(evals):
        log.eval_tokens.append(int(steps[step]["tokens"]) if step in steps else round(step * per_step))
        for name, into in (("held_out_exact_match", log.exact_match), ("held_out_token_accuracy", log.token_accuracy)):
            for key, value in evals[step].get(name, {}).items():
                if key.startswith("mean@"):
                    into.setdefault(int(key.split("@")[1]), []).append(float(value))
    return log


def plot_curves(path: str | Path, logs: Mapping[str, TrainLog]) -> Path:
    """Four panels against millions of tokens seen: LM loss, copy rows' loss, answer loss (nats per token) and
    held-out accuracy (%, one colour per run, one marker per row length: exact match in solid lines, answer tokens
    right in dotted ones). Returns the written path."""
    from ..reports.plot import pyplot, save_figure

    if not logs:
        raise ValueError("no training log to plot")
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.5), dpi=120)
    for i, (label, log) in enumerate(logs.items()):
        colour = f"C{i % 10}"
        millions = [t / 1e6 for t in log.tokens]
        for ax, values in ((axes[0], log.lm_loss), (axes[1], log.copy_loss), (axes[2], log.answer_loss)):
            pts = [(x, y) for x, y in zip(millions, values) if y is not None]
            if pts:
                ax.plot(*zip(*pts), label=label, color=colour, lw=1)
        markers = "osD^v"
        for j, length in enumerate(sorted(log.exact_match)):
            for values, style, what in ((log.exact_match[length], "-", "exact"),
                                        (log.token_accuracy.get(length, []), ":", "tokens")):  # fmt: skip
                if values:
                    xs = [t / 1e6 for t in log.eval_tokens[-len(values) :]]
                    axes[3].plot(xs, [100 * v for v in values], style, marker=markers[j % 5], color=colour,
                                 label=f"{label} @{length} {what}")  # fmt: skip
    titles = ("LM loss (text, copy pieces, prompts)", "copy rows' pieces (no copying: ~ln of the tokens drawn from)",
              "answer loss", "held-out accuracy")  # fmt: skip
    for ax, title, ylabel in zip(axes, titles, ("nats / token",) * 3 + ("%",)):
        ax.set(title=title, xlabel="tokens seen (M)", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[3].set_ylim(-5, 105)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot hybrid training logs side by side.")
    parser.add_argument("logs", nargs="+", help="LABEL=PATH of a train_log.jsonl")
    parser.add_argument("--out", required=True, help="image to write (.png)")
    args = parser.parse_args(argv)
    logs = {}
    for item in args.logs:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"expected LABEL=PATH, got {item!r}")
        logs[label] = read_log(path)
    print(f"wrote {plot_curves(args.out, logs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
