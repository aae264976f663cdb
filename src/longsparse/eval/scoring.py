"""RULER's scoring rules (``scripts/eval/synthetic/constants.py`` and ``scripts/eval/evaluate.py`` in NVIDIA/RULER).

A prediction is post-processed (stripped; control characters ``\\x00-\\x1f`` become newlines; stripped again) and then
compared with the references case-insensitively, by substring:

* ``string_match_all`` (every synthetic family): the fraction of the references found in the prediction.
* ``string_match_part`` (QA): 1 if any reference is found, else 0.

A task's score is the mean over its samples times 100 (RULER rounds it to 2 decimals for display; we keep full
precision and round only when printing). Per-sample scores here are in [0, 1].
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..tasks.ruler import MISSING_TASKS, TASKS

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """RULER's clean-up of a raw model output before matching."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """Fraction of ``references`` that occur in ``prediction`` (case-insensitive substring)."""
    if not references:
        raise ValueError("references must not be empty")
    pred = prediction.lower()
    return sum(r.lower() in pred for r in references) / len(references)


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any of ``references`` occurs in ``prediction`` (case-insensitive substring), else 0.0."""
    if not references:
        raise ValueError("references must not be empty")
    pred = prediction.lower()
    return float(max(r.lower() in pred for r in references))


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "niah": string_match_all,
    "variable_tracking": string_match_all,
    "common_words_extraction": string_match_all,
    "freq_words_extraction": string_match_all,
    "qa": string_match_part,
}

_QA_TASKS = frozenset(MISSING_TASKS)


def metric_for(task: str) -> Callable[[str, Sequence[str]], float]:
    """The metric RULER uses for ``task`` (a key of ``ruler.TASKS`` or a QA task)."""
    if task in TASKS:
        return METRICS[TASKS[task].family]
    if task in _QA_TASKS:
        return string_match_part
    raise ValueError(f"unknown task {task!r}")


def score(task: str, prediction: str, references: Sequence[str]) -> float:
    """Score in [0, 1] of one raw model output for ``task``."""
    return metric_for(task)(postprocess(prediction), references)


def task_score(scores: Sequence[float]) -> float:
    """RULER's task score: mean of per-sample scores times 100."""
    if not scores:
        raise ValueError("no scores to average")
    return 100.0 * sum(scores) / len(scores)
