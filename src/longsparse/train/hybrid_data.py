"""Training batches for the hybrid: public-domain text windows (LM loss) and RULER retrieval samples (answer loss).

Every batch is a pure function of ``(DataConfig, step, total_steps)`` and the tokenizer: row ``r`` of step ``s`` draws
its kind, task and window from ``numpy.random.default_rng([seed, s, r])``, and a retrieval row is sample
``s * rows + r`` of :class:`~longsparse.tasks.ruler.RulerGenerator` (seed ``TRAIN_SEED_OFFSET + seed``), so a resumed
run sees exactly the batches it would have seen, and several loader processes can build batches in any order.

A retrieval row is the sample's prompt (RULER's format: task text, answer prefix) followed by its answer as the
evaluation expects to read it (:func:`answer_text`) and ``<|endoftext|>``, then (``DataConfig.extra_query_share``)
more questions about the haystack's other needles, each answered. The answers and their end tokens carry the answer
loss; with ``DataConfig.prompt_loss`` the other tokens also carry LM loss. The sample's target length is chosen so that
everything fits the row; the rest of the row is padding (end tokens without loss): the model is causal, so padding
after a sequence never changes what comes before. A copy row (``DataConfig.copy_fraction``) repeats pieces of random
tokens.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..tasks.haystack import CORPORA, Corpus, load_corpus
from ..tasks.ruler import TASKS, RulerGenerator, Sample
from .tokenizer import TextCodec, eos_id

IGNORE = -100
# Generator seeds of training and held-out samples: far from `longsparse eval ruler`'s default seed (42), so no
# evaluation prompt is ever a training prompt.
TRAIN_SEED_OFFSET = 1_000_000
HELDOUT_SEED_OFFSET = 2_000_000
TRAIN_TASKS: tuple[str, ...] = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
)
# The shortest row each task is drawn in (with the default answer_room), measured with the hybrid's tokenizer and
# rounded up: the task text and its needles alone take ~130-300 tokens; vt's solved in-context example alone ~700.
# Shorter curriculum stages hold copy and text rows only.
MIN_ROW_LENGTH: dict[str, int] = {
    "niah_single_1": 256,
    "niah_single_2": 256,
    "niah_single_3": 256,
    "niah_multikey_1": 256,
    "niah_multikey_2": 256,
    "niah_multikey_3": 384,
    "niah_multivalue": 256,
    "niah_multiquery": 384,
    "vt": 1024,
}
DEFAULT_MIN_ROW_LENGTH = 512  # tasks not measured above
MIN_SEQ_LEN = 16
_TEXT_PIECE_WORDS = 2000
# Lengths of the pieces a copy row repeats (inclusive): each piece's first token is unpredictable, the rest copyable.
COPY_PIECE = (8, 32)
COPY_TOKENS = ("uniform", "stream")


@dataclass(frozen=True)
class DataConfig:
    """What a training step holds.

    ``seq_lens[i]`` is the row length (tokens) from fraction ``stage_ends[i - 1]`` of the steps up to ``stage_ends[i]``
    (the curriculum; the last end is 1). A step holds ``tokens_per_step // seq_len`` rows; each row is a text window
    with probability ``text_fraction``, a copy row with probability ``copy_fraction``, else a retrieval sample of one
    of ``tasks`` (uniformly among those whose ``MIN_ROW_LENGTH`` the row meets) on a haystack from ``corpora``; in a
    stage too short for every task, the retrieval share goes to copy rows (to text rows without them).
    ``answer_room``: tokens kept free after the prompt for the answer and the end token.

    ``copy_fraction``: the share of rows that are copy rows (:meth:`HybridDataMix.copy_row`): random tokens, then
    pieces of them again from random places, with loss on the pieces, which nothing but finding the current token's
    earlier occurrence can predict: the drill for the induction heads that retrieval needs. ``copy_tokens``: how the
    random tokens are drawn: ``"uniform"`` over the distinct tokens of the corpora (a token's earlier occurrence is
    almost always unique, so the current token alone says where to read on), or ``"stream"``, at random places of the
    corpora's token stream (frequent tokens recur many times within a row, so finding the right occurrence takes the
    tokens before it too).

    ``extra_query_share``: the share of a NIAH row, in tasks whose haystack holds keys the question does not ask
    (multi-key, multi-query), left after the sample for more questions about those keys, each answered with loss, as
    multi-query associative-recall drills do: one lookup per row is too sparse a signal to learn lookups from.
    Held-out rows never have them.

    ``prompt_loss``: a retrieval row's prompt also carries LM loss (its answer always carries the answer loss). Its
    in-context repetitions (the noise haystack's sentences, the needle sentence, the key asked again in the question
    and the answer prefix) are what teach a small model to copy from its context; with the answer alone, ~10 tokens of
    a row carry loss, and a 24 M model trained on 92 M tokens that way never retrieved a needle (docs/hybrid.md).
    """

    # the first stage is the copy drill: 64-token rows hold no task, so 90% are copy rows. A tiny model learnt to copy
    # pieces of 64-token copy rows within ~1 M tokens (300 steps) and kept the skill in longer rows; in rows of 256
    # tokens it did not start at all; the real model did not start within a 120-step stage (docs/hybrid.md)
    seq_lens: tuple[int, ...] = (64, 512, 1024, 2048, 4096, 8192)
    stage_ends: tuple[float, ...] = (0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
    tokens_per_step: int = 32768
    text_fraction: float = 0.1
    copy_fraction: float = 0.3
    copy_tokens: str = "uniform"
    tasks: tuple[str, ...] = TRAIN_TASKS
    corpora: tuple[str, ...] = CORPORA
    answer_room: int = 64
    prompt_loss: bool = True
    extra_query_share: float = 0.5
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "seq_lens", tuple(self.seq_lens))
        object.__setattr__(self, "stage_ends", tuple(float(e) for e in self.stage_ends))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "corpora", tuple(self.corpora))
        if not self.seq_lens or len(self.seq_lens) != len(self.stage_ends):
            raise ValueError(f"seq_lens and stage_ends need one entry per stage: {self.seq_lens}, {self.stage_ends}")
        if any(b <= a for a, b in zip(self.seq_lens, self.seq_lens[1:])) or self.seq_lens[0] < MIN_SEQ_LEN:
            raise ValueError(f"seq_lens must increase from at least {MIN_SEQ_LEN}, got {self.seq_lens}")
        if any(b <= a for a, b in zip(self.stage_ends, self.stage_ends[1:])) or self.stage_ends[-1] != 1.0:
            raise ValueError(f"stage_ends must increase to 1.0, got {self.stage_ends}")
        if self.stage_ends[0] <= 0:
            raise ValueError(f"stage_ends must be positive, got {self.stage_ends}")
        if self.tokens_per_step < self.seq_lens[-1]:
            raise ValueError(f"tokens_per_step={self.tokens_per_step} holds no row of {self.seq_lens[-1]} tokens")
        if not (0.0 <= self.text_fraction <= 1.0 and 0.0 <= self.copy_fraction <= 1.0):
            raise ValueError(f"text_fraction and copy_fraction must be in [0, 1], got {self.text_fraction}, "
                             f"{self.copy_fraction}")  # fmt: skip
        if self.text_fraction + self.copy_fraction > 1.0:
            raise ValueError(
                f"text_fraction + copy_fraction must be <= 1, got {self.text_fraction + self.copy_fraction}"
            )
        if self.copy_tokens not in COPY_TOKENS:
            raise ValueError(f"copy_tokens must be one of {COPY_TOKENS}, got {self.copy_tokens!r}")
        retrieval = self.text_fraction + self.copy_fraction < 1.0
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or (not self.tasks and retrieval):
            raise ValueError(f"tasks must be RULER tasks ({', '.join(TASKS)}), got {list(self.tasks)}")
        if retrieval and not any(self.tasks_at(t) for t in self.seq_lens):
            raise ValueError(f"no task in {self.tasks} fits rows of {self.seq_lens} tokens")
        bad = [c for c in self.corpora if c not in CORPORA]
        if bad or not self.corpora:
            raise ValueError(f"corpora must be a non-empty subset of {CORPORA}, got {list(self.corpora)}")
        if self.answer_room < 8:
            raise ValueError(f"answer_room must be >= 8, got {self.answer_room}")
        short = [t for t in self.seq_lens if self.tasks_at(t) and t <= self.answer_room]
        if retrieval and short:
            raise ValueError(f"rows of {short} tokens hold retrieval tasks but do not exceed answer_room="
                             f"{self.answer_room}")  # fmt: skip
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not 0.0 <= self.extra_query_share < 1.0:
            raise ValueError(f"extra_query_share must be in [0, 1), got {self.extra_query_share}")
        if not isinstance(self.prompt_loss, bool):
            raise ValueError(f"prompt_loss must be a bool, got {self.prompt_loss!r}")

    def seq_len(self, step: int, total_steps: int) -> int:
        """Row length of ``step`` (0-based) in a run of ``total_steps``."""
        if not 0 <= step < total_steps:
            raise ValueError(f"step must be in [0, {total_steps}), got {step}")
        fraction = step / total_steps
        for length, end in zip(self.seq_lens, self.stage_ends):
            if fraction < end:
                return length
        return self.seq_lens[-1]

    def rows(self, seq_len: int) -> int:
        return self.tokens_per_step // seq_len

    def tasks_at(self, seq_len: int) -> tuple[str, ...]:
        return tuple(t for t in self.tasks if seq_len >= min_row_length(t))


def answer_text(sample: Sample) -> str:
    """What the model should write after ``sample.prompt``, as RULER's answer prefixes read on: the values of each
    asked key in the order the question asks the keys, a key's values in the order they appear in the prompt, joined
    by commas (``" 1234567."``, ``" 12, 34, 56, 78."``); the variable names of ``vt`` separated by spaces, as in its
    in-context example. (RULER scores these tasks by containment, so the order is the easiest one to learn: each key
    of the question looked up in turn.)"""
    config = TASKS[sample.task]
    if config.family == "variable_tracking":
        return " ".join(sample.references)  # the answer prefix ends with a space; names come in chain order
    if config.family != "niah":
        raise ValueError(f"no answer format for task {sample.task!r} (family {config.family!r})")
    per_key = config.num_values  # references are grouped by asked key, in the question's order
    refs = sample.references
    ordered = [
        value
        for start in range(0, len(refs), per_key)
        for value in sorted(refs[start : start + per_key], key=lambda r: sample.prompt.find(f": {r}."))
    ]
    return " " + ", ".join(ordered) + "."


@dataclass(frozen=True)
class Row:
    """One training row before padding: ``ids``, the index of the first token that carries loss (0: all), the
    ``[start, end)`` token spans of its answers, each with its end token (none in a text or copy row), and whether it
    is a copy row."""

    ids: list[int]
    loss_from: int
    answer_spans: tuple[tuple[int, int], ...] = ()
    is_copy: bool = False

    @property
    def is_text(self) -> bool:
        return not self.answer_spans and not self.is_copy

    @property
    def answer_from(self) -> int | None:
        return self.answer_spans[0][0] if self.answer_spans else None


# A needle as RULER writes it (tasks.ruler): "One of the special magic numbers for swift-canoe is: 2687570."
_NEEDLE = re.compile(r"One of the special magic (numbers|words|uuids) for ([\w-]+) is: ([\w-]+)\.")


class HybridDataMix:
    """Builds training batches (see the module docstring). ``corpora``: loaded corpora to use instead of reading
    ``config.corpora`` from their packages (tests pass short ones); the LM text is all of them, tokenized once."""

    def __init__(self, tokenizer, config: DataConfig, corpora: Sequence[Corpus] | None = None):
        self.config = config
        self.codec = TextCodec(tokenizer)
        self.eos = eos_id(tokenizer)
        self.corpora = list(corpora) if corpora is not None else [load_corpus(c) for c in config.corpora]
        if not self.corpora:
            raise ValueError("corpora must not be empty")
        self.text_ids = np.concatenate([self._tokenize(c) for c in self.corpora])
        if len(self.text_ids) <= config.seq_lens[-1] + 1:
            raise ValueError(f"the corpora hold {len(self.text_ids)} tokens, too few for rows of {config.seq_lens[-1]}")
        self.vocab_ids = np.unique(self.text_ids)
        self._generators: dict[tuple[int, int], RulerGenerator] = {}

    def _tokenize(self, corpus: Corpus) -> np.ndarray:
        words = corpus.words
        pieces = [
            (" " if i else "") + " ".join(words[i : i + _TEXT_PIECE_WORDS])
            for i in range(0, len(words), _TEXT_PIECE_WORDS)
        ]
        return np.fromiter((t for p in pieces for t in self.codec.encode(p)), dtype=np.int64)

    def generator(self, seed: int, corpus: int) -> RulerGenerator:
        key = (seed, corpus)
        if key not in self._generators:
            self._generators[key] = RulerGenerator(self.codec, seed=seed, corpus=self.corpora[corpus])
        return self._generators[key]

    def retrieval_row(
        self, task: str, seq_len: int, index: int, *, seed: int, corpus: int = 0, extra_queries: bool = False
    ) -> Row:
        """Sample ``index`` of ``task`` whose prompt and answer fit ``seq_len`` tokens; with ``extra_queries`` (and
        ``DataConfig.extra_query_share`` > 0) a NIAH task with more keys than it asks leaves that share of the row
        for further questions about its other needles (:meth:`extra_queries`)."""
        config = TASKS[task]
        share = self.config.extra_query_share if extra_queries and _has_unasked_keys(config) else 0.0
        room = seq_len - self.config.answer_room
        generator = self.generator(seed, corpus)
        try:
            sample = generator.sample(task, int(room * (1 - share)) + config.max_new_tokens, index)
        except ValueError:  # the task's fixed text alone overflows the shortened row: no room for extra questions
            if not share:
                raise
            share = 0.0
            sample = generator.sample(task, room + config.max_new_tokens, index)
        prompt = self.codec.encode(sample.prompt)
        answer = self.codec.encode(answer_text(sample)) + [self.eos]
        if len(prompt) + len(answer) > seq_len:
            raise ValueError(
                f"{sample.id}: prompt ({len(prompt)}) + answer ({len(answer)}) tokens exceed the row ({seq_len}); "
                "raise answer_room"
            )
        ids = prompt + answer
        spans = [(len(prompt), len(ids))]
        if share:
            rng = np.random.default_rng([seed, zlib.crc32(task.encode()), seq_len, index])
            for question, reply in self.extra_queries(sample, rng):
                if len(ids) + len(question) + len(reply) > seq_len:
                    break
                ids += question
                spans.append((len(ids), len(ids) + len(reply)))
                ids += reply
        return Row(ids, 0 if self.config.prompt_loss else len(prompt), answer_spans=tuple(spans))

    def extra_queries(self, sample: Sample, rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
        """Questions about the needles of ``sample`` whose keys it does not ask, in random order, in the single-key
        form of the task's own question: ``"\nWhat is the special magic number for K mentioned in the provided text?
        The special magic number for K mentioned in the provided text is"`` and the reply ``" V."`` + end token."""
        values: dict[str, list[str]] = {}
        kinds: dict[str, str] = {}
        for kind, key, value in _NEEDLE.findall(sample.prompt):
            values.setdefault(key, []).append(value)
            kinds[key] = kind[:-1]
        asked = sample.prompt[sample.prompt.rfind("\nWhat ") :]
        keys = [k for k, v in values.items() if len(v) == 1 and f" {k}" not in asked]
        out = []
        for i in rng.permutation(len(keys)):
            key, kind = keys[i], kinds[keys[i]]
            text = f"\nWhat is the special magic {kind} for {key} mentioned in the provided text?"
            text += f" The special magic {kind} for {key} mentioned in the provided text is"
            out.append((self.codec.encode(text), self.codec.encode(f" {values[key][0]}.") + [self.eos]))
        return out

    def copy_row(self, rng: np.random.Generator, seq_len: int) -> Row:
        """``seq_len + 1`` tokens: ``h = (seq_len + 1) // 2`` drawn at random (``DataConfig.copy_tokens``), then
        pieces of them again, each ``COPY_PIECE`` tokens long from a random place of the first half; loss on the
        second half.

        Pieces from random places, not the first half repeated whole: a repeat at one fixed distance is learnt as
        "look back h tokens" (a position offset, which RoPE makes easy) and teaches nothing about finding a token's
        earlier occurrence, which is what retrieval needs (a tiny model did exactly that: docs/hybrid.md)."""
        half = (seq_len + 1) // 2
        source = self.vocab_ids if self.config.copy_tokens == "uniform" else self.text_ids
        drawn = source[rng.integers(len(source), size=half)]
        pieces, size = [drawn], half
        while size < seq_len + 1:
            length = int(rng.integers(COPY_PIECE[0], COPY_PIECE[1] + 1))
            start = int(rng.integers(0, max(half - length, 0) + 1))
            pieces.append(drawn[start : start + length])
            size += len(pieces[-1])
        ids = np.concatenate(pieces)[: seq_len + 1]
        return Row(ids.tolist(), loss_from=half, is_copy=True)

    def row(self, step: int, r: int, seq_len: int, rows: int) -> Row:
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, step, r])
        tasks = cfg.tasks_at(seq_len)
        draw = rng.random()  # text below text_fraction, copy up to text_fraction + copy_fraction, else retrieval
        if draw < cfg.text_fraction + cfg.copy_fraction or not tasks:
            if draw >= cfg.text_fraction and cfg.copy_fraction:
                return self.copy_row(rng, seq_len)
            start = int(rng.integers(len(self.text_ids) - seq_len - 1))
            return Row(self.text_ids[start : start + seq_len + 1].tolist(), 0)
        task = tasks[int(rng.integers(len(tasks)))]
        corpus = int(rng.integers(len(self.corpora)))
        return self.retrieval_row(
            task, seq_len, step * rows + r, seed=TRAIN_SEED_OFFSET + cfg.seed, corpus=corpus, extra_queries=True
        )

    def batch(self, step: int, total_steps: int) -> dict[str, torch.Tensor]:
        """Step ``step``'s rows: ``input_ids`` and ``targets`` ``[R, T]`` int64 (``targets[r, t]`` is the token after
        ``input_ids[r, t]`` where it carries loss, else ``IGNORE``), ``is_answer`` ``[R, T]`` bool (the target is an
        answer or its end token), ``is_text`` and ``is_copy`` ``[R]`` bool (a text row, a copy row)."""
        seq_len = self.config.seq_len(step, total_steps)
        rows = self.config.rows(seq_len)
        built = [self.row(step, r, seq_len, rows) for r in range(rows)]
        return collate(built, seq_len, self.eos)


def collate(rows: Sequence[Row], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Pad rows to ``seq_len`` inputs (a text row holds ``seq_len + 1`` tokens: inputs and the last target)."""
    input_ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.int64)
    targets = torch.full((len(rows), seq_len), IGNORE, dtype=torch.int64)
    is_answer = torch.zeros((len(rows), seq_len), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids = torch.tensor(row.ids, dtype=torch.int64)
        n = min(len(ids), seq_len)
        input_ids[i, :n] = ids[:n]
        # position t predicts ids[t + 1]; the first loss-carrying token is predicted from position loss_from - 1
        first = max(row.loss_from - 1, 0)
        targets[i, first : len(ids) - 1] = ids[first + 1 :]
        for start, end in row.answer_spans:  # position t predicts ids[t + 1]
            is_answer[i, start - 1 : end - 1] = True
    return {
        "input_ids": input_ids,
        "targets": targets,
        "is_answer": is_answer,
        "is_text": torch.tensor([r.is_text for r in rows]),
        "is_copy": torch.tensor([r.is_copy for r in rows]),
    }


class StepBatches(torch.utils.data.Dataset):
    """``dataset[step]`` is step ``step``'s batch (for a ``DataLoader`` with ``batch_size=None`` over a range of steps,
    so loader processes build upcoming batches while the model trains)."""

    def __init__(self, mix: HybridDataMix, total_steps: int):
        self.mix = mix
        self.total_steps = total_steps

    def __len__(self) -> int:
        return self.total_steps

    def __getitem__(self, step: int) -> dict[str, torch.Tensor]:
        return self.mix.batch(int(step), self.total_steps)


@dataclass(frozen=True)
class HeldOutSample:
    """A held-out retrieval row: ``ids`` (prompt, answer, end token) with the answer starting at ``answer_from``."""

    task: str
    seq_len: int
    ids: list[int]
    answer_from: int


def held_out_set(
    mix: HybridDataMix, tasks: Sequence[str], seq_lens: Sequence[int], per_task: int
) -> list[HeldOutSample]:
    """``per_task`` samples of each task at each length (where the task fits), from the held-out generator seed."""
    out = []
    seed = HELDOUT_SEED_OFFSET + mix.config.seed
    for seq_len in seq_lens:
        for task in tasks:
            if seq_len < min_row_length(task):
                continue
            for i in range(per_task):
                row = mix.retrieval_row(task, seq_len, i, seed=seed, corpus=i % len(mix.corpora))
                out.append(HeldOutSample(task, seq_len, row.ids, row.answer_from))
    return out


def min_row_length(task: str) -> int:
    """The shortest row (tokens) that holds a sample of ``task`` (:data:`MIN_ROW_LENGTH`)."""
    return MIN_ROW_LENGTH.get(task, DEFAULT_MIN_ROW_LENGTH)


def _has_unasked_keys(config) -> bool:
    """Whether a task's haystack holds needles under keys its question does not ask."""
    return config.family == "niah" and (config.haystack == "needle" or config.num_keys > config.num_queries)
