"""Run a model over RULER samples (greedy decoding, RULER's per-task generation budget) and score the outputs.

The model is anything with the surface of ``longsparse.LLM`` that the runner uses (``Model`` below): a
``generate(prompts, max_new_tokens=..., temperature=..., stop=...)`` returning objects with ``.text``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from ..tasks.ruler import Sample
from ..tasks.tokens import Tokenizer
from .scoring import score


@runtime_checkable
class GenerationOutput(Protocol):
    text: str


@runtime_checkable
class Model(Protocol):
    """The part of ``longsparse.LLM`` the evaluation uses."""

    tokenizer: Tokenizer

    def generate(
        self, prompts: list[str], *, max_new_tokens: int, temperature: float, stop: list[str]
    ) -> Sequence[GenerationOutput]: ...


@dataclass(frozen=True)
class SampleResult:
    """One scored sample, as stored in a run's JSON (``prompt_sha1`` lets two runs be paired safely). ``keep_ratio``:
    the fraction of GDN recurrence events that sparse GDN layers kept in the ``generate`` call that produced it (the
    model's ``last_stats.keep_ratio``; ``None`` without sparse GDN layers or without such stats)."""

    id: str
    task: str
    target_length: int
    index: int
    length: int
    prompt_tokens: int
    depths: tuple[float, ...]
    references: tuple[str, ...]
    prediction: str
    score: float
    prompt_sha1: str
    keep_ratio: float | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["depths"] = list(self.depths)
        d["references"] = list(self.references)
        return d


def prompt_sha1(prompt: str) -> str:
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()


def evaluate(
    model: Model,
    samples: Iterable[Sample],
    *,
    total: int | None = None,
    batch_size: int = 1,
    stop: Sequence[str] = (),
    progress: bool = True,
    description: str = "ruler",
) -> list[SampleResult]:
    """Generate greedily for every sample (batches of ``batch_size`` with one ``max_new_tokens``) and score.

    ``samples`` may be a lazy iterable (generation of long prompts then overlaps nothing, but the progress bar
    moves from the first batch on); ``total`` sizes the progress bar.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    from tqdm.auto import tqdm

    results: list[SampleResult] = []
    batch: list[Sample] = []
    with tqdm(total=total, desc=description, unit="sample", disable=not progress) as bar:

        def flush():
            outs = model.generate(
                [s.prompt for s in batch], max_new_tokens=batch[0].max_new_tokens, temperature=0.0, stop=list(stop)
            )
            if len(outs) != len(batch):
                raise ValueError(f"the model returned {len(outs)} outputs for {len(batch)} prompts")
            keep = getattr(getattr(model, "last_stats", None), "keep_ratio", None)
            for s, out in zip(batch, outs):
                results.append(_result(s, out.text, keep))
            bar.update(len(batch))
            batch.clear()

        for s in samples:
            if batch and (len(batch) == batch_size or s.max_new_tokens != batch[0].max_new_tokens):
                flush()
            batch.append(s)
        if batch:
            flush()
    return results


def _result(sample: Sample, prediction: str, keep_ratio: float | None) -> SampleResult:
    return SampleResult(
        id=sample.id,
        task=sample.task,
        target_length=sample.target_length,
        index=sample.index,
        length=sample.length,
        prompt_tokens=sample.prompt_tokens,
        depths=sample.depths,
        references=sample.references,
        prediction=prediction,
        score=score(sample.task, prediction, sample.references),
        prompt_sha1=prompt_sha1(sample.prompt),
        keep_ratio=None if keep_ratio is None else float(keep_ratio),
    )
