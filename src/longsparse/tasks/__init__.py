"""What the applications run a model on, shared by evaluation, training and benchmarks (none of which imports
another): haystack corpora and word lists, RULER's synthetic tasks, token counting and budgets, and token streams
with their deterministic draws.

* :mod:`.haystack` — RULER's noise sentences and the public-domain texts packages ship; :mod:`.words` — needle keys;
* :mod:`.tokens` — counting tokens, fitting a prompt to a budget, reading a length such as ``"4k"``;
* :mod:`.ruler` — RULER's tasks generated at a target length; :mod:`.streams` — token streams and each step's draw;
* :mod:`.state_recall` — needles and multi-query associative recall in byte-level text, for models without attention.
"""

from .haystack import CORPORA, Corpus, load_corpus
from .ruler import ALL_TASKS, MISSING_TASKS, TASKS, RulerGenerator, Sample
from .streams import TokenStream, draw_positions, draw_sequence, load_token_stream, step_rng
from .tokens import TokenCounter, Tokenizer, fit_to_budget, parse_length

__all__ = [
    "ALL_TASKS",
    "CORPORA",
    "MISSING_TASKS",
    "TASKS",
    "Corpus",
    "RulerGenerator",
    "Sample",
    "TokenCounter",
    "TokenStream",
    "Tokenizer",
    "draw_positions",
    "draw_sequence",
    "fit_to_budget",
    "load_corpus",
    "load_token_stream",
    "parse_length",
    "step_rng",
]
