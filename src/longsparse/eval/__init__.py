"""Long-context evaluation: RULER's synthetic tasks at any length in the model's tokenizer."""

from .haystack import CORPORA, Corpus, load_corpus
from .ruler import ALL_TASKS, MISSING_TASKS, TASKS, RulerGenerator, Sample
from .tokens import TokenCounter, Tokenizer

__all__ = [
    "ALL_TASKS",
    "CORPORA",
    "Corpus",
    "MISSING_TASKS",
    "RulerGenerator",
    "Sample",
    "TASKS",
    "TokenCounter",
    "Tokenizer",
    "load_corpus",
]
