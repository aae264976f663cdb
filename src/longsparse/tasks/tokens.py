"""Counting tokens in the model's tokenizer, fitting a generated prompt to a token budget, and reading a length such
as ``"4k"``.

A prompt is built from a variable number ``n`` of haystack units (words, sentences, lines, list entries). Encoding
the whole prompt for every candidate ``n`` of a binary search would cost O(T log T) per sample at T tokens, so the
search runs on an additive estimate instead: each distinct unit text is encoded once (memoised), and the prompt's
size is the size of its fixed part plus the units' sizes. Byte-level BPE tokenizers with a GPT-2-style pre-tokenizer
(SmolLM2, Llama 3, Qwen) split text at every space-letter boundary before merging, so this estimate is exact for
space-separated units; the exact count of the chosen prompt is then measured once or twice and the estimate's error
is corrected, which also covers tokenizers where the estimate is only close.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tokenizer(Protocol):
    """What the generators need from a tokenizer: ``encode(text) -> list[int]`` and ``decode(ids) -> str``."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class TokenCounter:
    """Token counts of whole prompts (exact) and of pieces of text (memoised, without special tokens).

    ``count(text)`` is ``len(tokenizer.encode(text))``, special tokens the tokenizer adds included: that is what the
    model reads. ``piece(text)`` subtracts what ``encode("")`` returns (a BOS token, for tokenizers that add one), so
    pieces add up; it remembers every piece it has seen for the lifetime of this object.
    """

    def __init__(self, tokenizer: Tokenizer):
        if not callable(getattr(tokenizer, "encode", None)):
            raise ValueError(f"tokenizer must have an encode(text) -> list[int] method, got {type(tokenizer).__name__}")
        self.tokenizer = tokenizer
        self._special = len(tokenizer.encode(""))
        self._memo: dict[str, int] = {}

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def piece(self, text: str) -> int:
        n = self._memo.get(text)
        if n is None:
            n = self._memo[text] = len(self.tokenizer.encode(text)) - self._special
        return n

    def pieces(self, texts: Iterable[str]) -> np.ndarray:
        """``piece`` of each text, as an int64 array."""
        return np.fromiter((self.piece(t) for t in texts), dtype=np.int64)


def fit_to_budget(
    estimate: Callable[[int], int],
    measure: Callable[[int], int],
    budget: int,
    n_max: int,
    *,
    rounds: int = 8,
) -> tuple[int, int]:
    """The largest ``n`` in ``[0, n_max]`` whose measured size is at most ``budget``, and that size.

    ``estimate(n)`` must be cheap and non-decreasing in ``n``; ``measure(n)`` is the exact token count (expensive).
    The search finds the largest ``n`` with ``estimate(n) + offset <= budget``, measures it, sets ``offset`` to the
    estimate's error there and repeats until ``n`` stops changing (at most ``rounds`` measurements). If the error
    differs from place to place (a non-additive tokenizer), the result is then refined by bisection between the
    best fitting ``n`` and the smallest measured ``n`` that does not fit.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    best: tuple[int, int] | None = None
    offset = 0
    tried: set[int] = set()
    too_big: list[int] = []
    n = _largest_within(estimate, budget, n_max)
    for _ in range(rounds):
        tried.add(n)
        size = measure(n)
        if size > budget:
            too_big.append(n)
        if size <= budget and (best is None or size > best[1]):
            best = (n, size)
        offset = size - estimate(n)
        nxt = _largest_within(estimate, budget - offset, n_max)
        if size > budget and nxt >= n:
            nxt = n - 1
        if nxt < 0 or nxt in tried:
            break
        n = nxt
    if best is None:
        raise ValueError(f"cannot fit the prompt into {budget} tokens: its fixed part alone is {measure(0)} tokens")
    hi = min((m for m in too_big if m > best[0]), default=best[0] + 1)
    while hi - best[0] > 1:
        mid = (best[0] + hi) // 2
        size = measure(mid)
        if size <= budget:
            best = (mid, size)
        else:
            hi = mid
    return best


def _largest_within(estimate: Callable[[int], int], budget: int, n_max: int) -> int:
    """Largest n in [0, n_max] with estimate(n) <= budget (0 if even estimate(0) exceeds it)."""
    lo, hi = 0, n_max
    if estimate(hi) <= budget:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def parse_length(text: str) -> int:
    """``"4k" -> 4096``, ``"128K" -> 131072``, ``"3000" -> 3000``."""
    t = text.strip().lower()
    try:
        value = int(t[:-1]) * 1024 if t.endswith("k") else int(t)
    except ValueError:
        raise ValueError(f"length must be an integer, optionally with a K suffix (x1024), got {text!r}") from None
    if value <= 0:
        raise ValueError(f"length must be positive, got {text!r}")
    return value
