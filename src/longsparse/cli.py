"""The `longsparse` command line.

Each subcommand lives in the module that owns its work and provides two functions:
``configure(parser)`` adds its arguments, ``run(args) -> int`` does the work. This file only wires them up.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (name, module, one-line help)
COMMANDS: list[tuple[str, str, str]] = [
    ("info", "longsparse.info", "versions, GPU, how Triton kernels run here, optional peers"),
    ("bench", "longsparse.bench.cli", "benchmarks against the strongest available peers"),
    ("generate", "longsparse.engine.cli", "generate text with a model loaded from a checkpoint or GGUF file"),
    ("serve", "longsparse.serve.cli", "serve a model over HTTP with OpenAI's API (continuous batching)"),
    ("eval", "longsparse.eval.cli", "RULER-style long-context evaluation and paired comparisons of two runs"),
    ("train-forecast", "longsparse.train.cli", "train SparDA Forecast projections for a frozen model (an adapter)"),
    (
        "train-hybrid",
        "longsparse.train.hybrid_cli",
        "train the small Qwen3.5 hybrid that SparseGDN quality is measured on",
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longsparse", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module, help_text in COMMANDS:
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
