"""Records and renderings shared by benchmarks, evaluation and training (none of which imports another): result files
with the environment that produced them, terminal tables, and plots.

* :mod:`.results` — ``benchmarks/results/<name>.json`` files (:class:`BenchmarkResult`, :func:`environment`);
* :mod:`.tables` — fixed-width terminal tables and speed-up ratios; :mod:`.plot` — matplotlib figures, drawn
  off-screen (matplotlib imported on first use).
"""

from .results import BenchmarkResult, RowLog, environment, load
from .tables import format_table, ratio

__all__ = ["BenchmarkResult", "RowLog", "environment", "format_table", "load", "ratio"]
