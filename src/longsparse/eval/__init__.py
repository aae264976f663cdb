"""Long-context evaluation: RULER's synthetic tasks at any length in the model's tokenizer, RULER's scoring, and
paired comparisons of two configurations (e.g. dense vs sparse) on the same samples.

    from longsparse.eval import MISSING_TASKS, TASKS, RulerGenerator, RulerRun, evaluate

    gen = RulerGenerator(llm.tokenizer, seed=42)
    samples = [s for k in (4096, 8192) for t in TASKS for s in gen.samples(t, k, 100)]
    run = RulerRun.from_results("dense", {}, evaluate(llm, samples), MISSING_TASKS)

Command line: ``longsparse eval ruler ...`` and ``longsparse eval compare A.json B.json`` (docs/eval.md).
"""

from ..tasks import (
    ALL_TASKS,
    CORPORA,
    MISSING_TASKS,
    TASKS,
    Corpus,
    RulerGenerator,
    Sample,
    TokenCounter,
    Tokenizer,
    load_corpus,
)
from .paired import Comparison, PairedDifference, compare_records, paired_bootstrap
from .report import RulerRun, format_comparison, format_scores, load_run, plot_scores
from .runner import Model, SampleResult, evaluate
from .scoring import score, string_match_all, string_match_part

__all__ = [
    "ALL_TASKS",
    "CORPORA",
    "Comparison",
    "Corpus",
    "MISSING_TASKS",
    "Model",
    "PairedDifference",
    "RulerGenerator",
    "RulerRun",
    "Sample",
    "SampleResult",
    "TASKS",
    "TokenCounter",
    "Tokenizer",
    "compare_records",
    "evaluate",
    "format_comparison",
    "format_scores",
    "load_corpus",
    "load_run",
    "paired_bootstrap",
    "plot_scores",
    "score",
    "string_match_all",
    "string_match_part",
]
