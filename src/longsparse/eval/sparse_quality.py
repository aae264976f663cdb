"""Accuracy of block-sparse attention against dense on the same RULER samples, and what it keeps.

:func:`run_variant` evaluates one :class:`~longsparse.eval.attention_variants.AttentionVariant` of a loaded ``LLM``
over samples (greedy, RULER's generation budgets, prompts batched per task and length) and returns a
:class:`~longsparse.eval.report.RulerRun` whose records also hold the share of KV blocks the attention read:
``attention_keep`` in decode (attended blocks / causal blocks per step, averaged over the batch's steps, layers and
KV heads — the keep ratio: what a decode step reads of the context) and ``attention_prefill_keep``.
:func:`keep_summary` compares runs with a baseline (paired bootstrap per length and overall).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..tasks.ruler import RulerGenerator, Sample
from .attention_variants import AttentionVariant, apply_variant
from .paired import DEFAULT_RESAMPLES, compare_records
from .quality import common_samples
from .report import RulerRun
from .runner import _result


def model_tokenizer(model: str):
    """The tokenizer of a model (``"default"``, a ``.gguf`` file or a checkpoint folder) without its weights."""
    from ..models.loader import default_model_path
    from ..models.tokenizer import load_gguf_tokenizer, load_tokenizer

    path = default_model_path() if str(model) == "default" else Path(model)
    tokenizer = load_gguf_tokenizer(path) if path.suffix == ".gguf" else load_tokenizer(path)
    if tokenizer is None:
        raise ValueError(f"{model} has no tokenizer: RULER prompts are text")
    return tokenizer


def ruler_samples(
    tokenizer, tasks: Sequence[str], lengths: Sequence[int], count: int, seed: int, path: str | Path | None = None
) -> list[Sample]:
    """``count`` samples of every task at every length (seed ``seed``), length-major. With ``path``: read from that
    JSON when it exists (then no haystack package is needed: a GPU machine can take samples generated elsewhere), else
    generated and written there."""
    wanted = [(t, n, i) for n in lengths for t in tasks for i in range(count)]
    path = Path(path) if path is not None else None
    if path is not None and path.exists():
        data = json.loads(path.read_text())
        if data.get("seed") != seed:
            raise ValueError(f"{path} holds samples of seed {data.get('seed')}, not {seed}")
        stored = {(s["task"], s["target_length"], s["index"]): Sample.from_dict(s) for s in data["samples"]}
        missing = [w for w in wanted if w not in stored]
        if missing:
            raise ValueError(f"{path} lacks {len(missing)} of the samples asked for, e.g. {missing[0]}")
        return [stored[w] for w in wanted]
    generator = RulerGenerator(tokenizer, seed=seed)
    samples = [generator.sample(t, n, i) for t, n, i in wanted]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"seed": seed, "samples": [s.as_dict() for s in samples]}) + "\n")
    return samples


def _batches(samples: Iterable[Sample], batch_size: int) -> Iterable[list[Sample]]:
    batch: list[Sample] = []
    for s in samples:
        key = (s.task, s.target_length, s.max_new_tokens)
        first = batch[0] if batch else None
        if first and (len(batch) == batch_size or key != (first.task, first.target_length, first.max_new_tokens)):
            yield batch
            batch = []
        batch.append(s)
    if batch:
        yield batch


def run_variant(
    llm,
    variant: AttentionVariant,
    samples: Sequence[Sample],
    *,
    forecast=None,
    batch_size: int = 16,
    progress: bool = False,
) -> RulerRun:
    """``variant`` of ``llm`` (put in place by :func:`apply_variant`) over ``samples``: a run named after the variant
    whose config is the variant's, one record per sample with ``attention_keep`` / ``attention_prefill_keep``."""
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    apply_variant(llm, variant, forecast)
    records = []
    with tqdm(total=len(samples), desc=variant.name, unit="sample", disable=not progress) as bar:
        for batch in _batches(samples, batch_size):
            outs = llm.generate([s.prompt for s in batch], max_new_tokens=batch[0].max_new_tokens, temperature=0.0)
            stats = llm.last_stats
            for s, out in zip(batch, outs):
                record = _result(s, out.text, None).as_dict()
                record["attention_keep"] = stats.decode_block_fraction
                record["attention_prefill_keep"] = stats.prefill_block_fraction
                records.append(record)
            bar.update(len(batch))
    return RulerRun(variant.name, variant.as_dict(), records)


def mean_keep(run: RulerRun, length: int | None = None, key: str = "attention_keep") -> float | None:
    """Mean of ``key`` over the run's samples (of one target length), None if none has it (dense runs)."""
    values = [
        float(r[key])
        for r in run.samples
        if r.get(key) is not None and (length is None or int(r["target_length"]) == length)
    ]
    return float(np.mean(values)) if values else None


def keep_summary(
    runs: Mapping[str, RulerRun],
    baseline: str,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict:
    """Each run against ``runs[baseline]`` on the samples both hold (a run cut short by a time limit holds fewer):
    per run and per length (and over lengths) its score, keep ratios, and the paired difference ``run − baseline`` in
    points with its 95% interval."""
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(runs)}")
    base = runs[baseline]
    out: dict = {}
    for label, run in runs.items():
        entry: dict = {
            "score": run.summary()["score"],
            "keep_ratio": mean_keep(run),
            "prefill_keep_ratio": mean_keep(run, key="attention_prefill_keep"),
            "samples": len(run.samples),
            "per_length": {},
        }
        comparison = None
        if label != baseline:
            paired = common_samples({"baseline": base, "run": run})
            comparison = compare_records(
                paired["baseline"].samples, paired["run"].samples, resamples=resamples, seed=seed
            )
            entry["minus_baseline"] = _interval(comparison.overall)
        for length in run.lengths():
            at = {
                "score": run.summary()["per_length"][str(length)],
                "keep_ratio": mean_keep(run, length),
                "prefill_keep_ratio": mean_keep(run, length, "attention_prefill_keep"),
            }
            if comparison is not None and length in comparison.per_length:
                at["minus_baseline"] = _interval(comparison.per_length[length])
            entry["per_length"][str(length)] = at
        out[label] = entry
    return out


def _interval(d) -> dict:
    return {"difference": d.difference, "low": d.low, "high": d.high, "samples": d.samples}
