"""`longsparse bench SUITE`: each suite module provides ``configure(parser)`` and ``run(args) -> int``; it is imported
only when its suite is given (the suites need the GPU extras: triton, and the peers they compare against)."""

from __future__ import annotations

from ..cli_args import CommandParser, add_compute_options, torch_threads

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
        "locality",
        "longsparse.bench.locality",
        "block-selection locality of recorded decode traces, and the fitted process `decode` replays",
    ),
    (
        "model",
        "longsparse.bench.model",
        "whole-model prefill (latency, memory, components) and decode vs transformers (Qwen3.5-4B/9B, MiniCPM4.1-8B)",
    ),
    (
        "tensor-parallel",
        "longsparse.bench.tensor_parallel",
        "a model split across GPUs (tensor parallelism) vs one GPU: prefill and decode (Qwen3.5-9B geometry)",
    ),
    (
        "serve",
        "longsparse.bench.serve",
        "an OpenAI-compatible server under load (TTFT, TPOT, throughput), concurrent against one at a time",
    ),
]


class SuiteParser(CommandParser):
    """A suite's parser: the suite module's arguments, then ``--threads`` and ``--verbose`` unless it has them; its
    command is ``args._suite_run``."""

    run_attribute = "_suite_run"

    def _load(self) -> None:
        if self._module is None:
            return
        super()._load()
        if "--threads" not in self._option_string_actions:
            add_compute_options(self)


def configure(parser) -> None:
    parser.add_argument("--out", default="benchmarks", help="directory holding results/ and plots/")
    sub = parser.add_subparsers(dest="suite", required=True, metavar="SUITE", parser_class=SuiteParser)
    for name, module, help_text in SUITES:
        sub.add_parser(name, help=help_text, description=help_text, module=module)


def run(args) -> int:
    with torch_threads(getattr(args, "threads", None)):
        return int(args._suite_run(args) or 0)
