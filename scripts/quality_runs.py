"""Put several `longsparse eval ruler` runs on the same samples side by side against a baseline run, with paired
bootstrap intervals, as one results JSON and a plot (benchmarks/results/quality_gdn.json, quality_attn.json).

    python scripts/quality_runs.py dense=DENSE.json sparse=SPARSE.json random=RANDOM.json --baseline dense \
        --keep-ratio-of sparse --out benchmarks/results/quality_gdn.json --plot benchmarks/plots/quality_gdn.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from longsparse.eval.quality import common_samples, side_by_side
from longsparse.eval.report import load_run, plot_scores
from longsparse.reports.results import environment


def _labelled(text: str) -> tuple[str, str]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH, got {text!r}")
    return label, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=_labelled, help="LABEL=PATH of a run JSON, two or more")
    parser.add_argument("--baseline", required=True, help="label of the run the others are compared with")
    parser.add_argument("--keep-ratio-of", default=None, help="label whose GDN keep ratio is the summary's keep_ratio")
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot", required=True)
    parser.add_argument("--resamples", type=int, default=20_000)
    parser.add_argument(
        "--common", action="store_true", help="compare on the samples all runs share (runs of different sizes)"
    )
    args = parser.parse_args(argv)
    paths = dict(args.runs)
    if len(paths) != len(args.runs):
        parser.error("run labels must be distinct")
    runs = {label: load_run(path) for label, path in paths.items()}
    if args.common:
        runs = common_samples(runs)
    result = side_by_side(runs, args.baseline, keep_ratio_of=args.keep_ratio_of, resamples=args.resamples)
    data = {"name": Path(args.out).stem, "kind": "ruler-quality", "environment": environment(), **result}
    data["common_samples_only"] = args.common
    data["runs"] = {label: {"path": paths[label], **info} for label, info in result["runs"].items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    plot = plot_scores(args.plot, runs)
    s = data["summary"]
    print("  ".join(f"{label} {s[f'{label}_score']:.1f}" for label in runs) + f"  keep ratio {s['keep_ratio']}")
    print(f"wrote {out} and {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
