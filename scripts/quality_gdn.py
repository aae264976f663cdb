"""Assemble benchmarks/results/quality_gdn.json from three `longsparse eval ruler` runs on the same samples: dense GDN
(the baseline), SparseGDN's default and the random-selection ablation (docs/hybrid.md).

    python scripts/quality_gdn.py DENSE.json SPARSE.json RANDOM.json --out benchmarks/results/quality_gdn.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from longsparse.bench.results import environment
from longsparse.eval.quality import side_by_side
from longsparse.eval.report import load_run, plot_scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dense")
    parser.add_argument("sparse")
    parser.add_argument("random")
    parser.add_argument("--out", default="benchmarks/results/quality_gdn.json")
    parser.add_argument("--plot", default="benchmarks/plots/quality_gdn.png")
    parser.add_argument("--resamples", type=int, default=20_000)
    args = parser.parse_args(argv)
    runs = {label: load_run(getattr(args, label)) for label in ("dense", "sparse", "random")}
    result = side_by_side(runs, "dense", keep_ratio_of="sparse", resamples=args.resamples)
    data = {"name": Path(args.out).stem, "kind": "ruler-quality", "environment": environment(), **result}
    data["runs"] = {label: {"path": getattr(args, label), **info} for label, info in result["runs"].items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    plot = plot_scores(args.plot, runs)
    s = data["summary"]
    print(
        f"dense {s['dense_score']:.1f}  sparse {s['sparse_score']:.1f}  random {s['random_score']:.1f}  "
        f"keep ratio {s['keep_ratio']}\nwrote {out} and {plot}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
