"""Paired comparison of two configurations on the same samples: difference and paired bootstrap interval.

As SparseGDN (Zhuang et al., arXiv:2610.41420) reports quality (Secs. 3.1 and 3.5, Tables 4–5): the aggregate score is
the mean over (task, length) strata of each stratum's mean score (RULER's average over tasks, then over lengths; with
equal stratum sizes it is the plain mean), the difference is B − A in percentage points, and the 95% interval is the
2.5th-97.5th percentile of that difference over 20,000 paired bootstrap resamples: within every stratum, samples are
drawn with replacement and both configurations keep their scores on the drawn samples. No adjustment for multiple
comparisons.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_RESAMPLES = 20_000
# Bound on the index matrix drawn at once (elements), so 20,000 resamples of a large stratum stay small in memory.
_MAX_DRAW = 4_000_000


@dataclass(frozen=True)
class PairedDifference:
    """Aggregate scores of A and B (percent), ``difference = b - a`` (percentage points) and its interval."""

    a: float
    b: float
    difference: float
    low: float
    high: float
    samples: int
    strata: int
    resamples: int
    confidence: float

    def as_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    strata: Sequence[Hashable] | None = None,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedDifference:
    """Paired, stratified bootstrap of the difference of aggregate scores.

    ``a[i]``, ``b[i]``: scores in [0, 1] of configurations A and B on sample i; ``strata[i]``: its stratum (e.g.
    ``(task, length)``), None for one stratum. The aggregate is the unweighted mean of stratum means, times 100.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(f"a and b must be non-empty 1-D arrays of one length, got shapes {a.shape} and {b.shape}")
    if strata is None:
        strata = [0] * a.size
    if len(strata) != a.size:
        raise ValueError(f"strata has {len(strata)} labels for {a.size} samples")
    if not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an int >= 1, got {resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")

    labels = sorted(set(strata), key=repr)  # a fixed order, so a seed gives the same draws every time
    index = {label: i for i, label in enumerate(labels)}
    group = np.fromiter((index[s] for s in strata), dtype=np.int64, count=a.size)
    rng = np.random.default_rng(seed)
    diff = b - a
    boot = np.zeros(resamples)
    means_a, means_b = [], []
    for g in range(len(labels)):
        d = diff[group == g]
        means_a.append(a[group == g].mean())
        means_b.append(b[group == g].mean())
        rows = max(1, _MAX_DRAW // d.size)
        for start in range(0, resamples, rows):
            stop = min(resamples, start + rows)
            boot[start:stop] += d[rng.integers(0, d.size, size=(stop - start, d.size))].mean(axis=1)
    boot *= 100.0 / len(labels)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(boot, [tail, 100.0 - tail])
    score_a, score_b = 100.0 * float(np.mean(means_a)), 100.0 * float(np.mean(means_b))
    return PairedDifference(
        a=score_a,
        b=score_b,
        difference=100.0 * float(np.mean(np.subtract(means_b, means_a))),
        low=float(low),
        high=float(high),
        samples=int(a.size),
        strata=len(labels),
        resamples=resamples,
        confidence=confidence,
    )


@dataclass(frozen=True)
class Comparison:
    """B versus A on their common samples: overall, per target length and per task."""

    overall: PairedDifference
    per_length: dict[int, PairedDifference]
    per_task: dict[str, PairedDifference]

    def as_dict(self) -> dict:
        return {
            "overall": self.overall.as_dict(),
            "per_length": {str(k): v.as_dict() for k, v in self.per_length.items()},
            "per_task": {k: v.as_dict() for k, v in self.per_task.items()},
        }


def compare_records(
    a: Sequence[dict],
    b: Sequence[dict],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Comparison:
    """Pair two runs' per-sample records (``id``, ``task``, ``target_length``, ``prompt_sha1``, ``score``).

    Both runs must hold exactly the same samples (same ids and the same prompts): a paired comparison on different
    samples would be meaningless, so any mismatch raises ValueError.
    """
    by_id_a = _by_id(a, "A")
    by_id_b = _by_id(b, "B")
    if by_id_a.keys() != by_id_b.keys():
        only_a = sorted(by_id_a.keys() - by_id_b.keys())[:3]
        only_b = sorted(by_id_b.keys() - by_id_a.keys())[:3]
        raise ValueError(f"the runs hold different samples (only in A: {only_a}, only in B: {only_b})")
    ids = sorted(by_id_a)
    for i in ids:
        if by_id_a[i].get("prompt_sha1") != by_id_b[i].get("prompt_sha1"):
            raise ValueError(f"sample {i} has different prompts in the two runs (other seed, tokenizer or template?)")
    tasks = [by_id_a[i]["task"] for i in ids]
    lengths = [int(by_id_a[i]["target_length"]) for i in ids]
    sa = np.array([by_id_a[i]["score"] for i in ids], dtype=np.float64)
    sb = np.array([by_id_b[i]["score"] for i in ids], dtype=np.float64)
    kw = dict(resamples=resamples, confidence=confidence, seed=seed)
    overall = paired_bootstrap(sa, sb, list(zip(tasks, lengths)), **kw)
    per_length = {}
    for length in sorted(set(lengths)):
        m = np.array([x == length for x in lengths])
        per_length[length] = paired_bootstrap(sa[m], sb[m], [t for t, k in zip(tasks, m) if k], **kw)
    per_task = {}
    for task in dict.fromkeys(tasks):
        m = np.array([t == task for t in tasks])
        per_task[task] = paired_bootstrap(sa[m], sb[m], [x for x, k in zip(lengths, m) if k], **kw)
    return Comparison(overall, per_length, per_task)


def _by_id(records: Sequence[dict], name: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in records:
        if r["id"] in out:
            raise ValueError(f"run {name} holds sample {r['id']} twice")
        out[r["id"]] = r
    return out
