"""One benchmark harness for every figure: timers, environment capture, JSON results, tables, plots.

Suites live in their own modules (``longsparse bench <suite>``); each measures ours and the strongest peers side by
side in one process and writes ``benchmarks/results/<suite>.json`` plus a plot.
"""

from ..reports.results import BenchmarkResult, environment, load
from ..reports.tables import format_table, ratio
from .timing import Timing, benchmark, benchmark_side_by_side, gbps, host_issue_ms, peak_memory_increment, tflops

__all__ = [
    "BenchmarkResult",
    "Timing",
    "benchmark",
    "benchmark_side_by_side",
    "environment",
    "format_table",
    "gbps",
    "host_issue_ms",
    "load",
    "peak_memory_increment",
    "ratio",
    "tflops",
]
