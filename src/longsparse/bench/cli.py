"""`longsparse bench SUITE`: each suite module provides ``configure(parser)`` and ``run(args) -> int``."""

from __future__ import annotations

import importlib

# (suite, module, help). A suite is listed once its module exists.
SUITES: list[tuple[str, str, str]] = [
    ("gdn", "longsparse.bench.gdn", "SparseGDN prefill vs FLA and FlashQLA (Qwen3.5 GDN geometry)"),
    (
        "attn",
        "longsparse.bench.attn",
        "SparDA / InfLLM-V2 block-sparse attention vs SDPA flash (MiniCPM4.1-8B geometry)",
    ),
    (
        "decode",
        "longsparse.bench.decode",
        "decode throughput: Dense†, Sparse†, offloaded Sparse, SparDA w/o and with prefetch (MiniCPM4.1-8B geometry)",
    ),
    (
        "model",
        "longsparse.bench.model",
        "whole-model prefill (latency, memory, components) and decode vs transformers (Qwen3.5-4B/9B, MiniCPM4.1-8B)",
    ),
    (
        "serve",
        "longsparse.bench.serve",
        "an OpenAI-compatible server under load (TTFT, TPOT, throughput), concurrent against one at a time",
    ),
]


def configure(parser) -> None:
    parser.add_argument(
        "--out", default="benchmarks", help="directory holding results/ and plots/ (default: %(default)s)"
    )
    sub = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for name, module, help_text in SUITES:
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.configure(p)
        p.set_defaults(_suite_run=mod.run)


def run(args) -> int:
    return int(args._suite_run(args) or 0)
