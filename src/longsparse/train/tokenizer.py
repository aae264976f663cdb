"""A small byte-level BPE vocabulary for the trained hybrid, learned from the haystack text it is trained on.

Pre-tokenisation is GPT-2's (``ByteLevel`` with its regex, no prefix space) after splitting every digit off on its
own, so a 7-digit needle value is 7 tokens whose identities do not depend on their neighbours: copying it is a plain
induction task. The vocabulary has one special token, ``<|endoftext|>`` (end of sequence and padding); no BOS is
added, so ``encode(text)`` is the same through ``tokenizers`` and through transformers' loaded copy.

Training (``tokenizers.trainers.BpeTrainer``) is deterministic for a given list of texts and vocabulary size.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .._optional import require

EOS_TOKEN = "<|endoftext|>"
# BpeTrainer counts pairs over these pieces: short pieces keep its memory low, boundaries cost a few merges at most.
_TRAIN_PIECE_CHARS = 100_000


def train_bpe(texts: Sequence[str], vocab_size: int):
    """A ``tokenizers.Tokenizer`` (byte-level BPE, digits split) with ``vocab_size`` entries learned from ``texts``."""
    if not isinstance(vocab_size, int) or vocab_size < 257:
        raise ValueError(f"vocab_size must be an int >= 257 (256 bytes + {EOS_TOKEN}), got {vocab_size!r}")
    if not texts or not any(texts):
        raise ValueError("texts must hold some text to learn merges from")
    tk = require("tokenizers", "training the hybrid's tokenizer")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Digits(individual_digits=True), tk.pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    pieces = [t[i : i + _TRAIN_PIECE_CHARS] for t in texts for i in range(0, len(t), _TRAIN_PIECE_CHARS)]
    tokenizer.train_from_iterator(pieces, trainer)
    return tokenizer


def save_for_transformers(tokenizer, directory: str | Path) -> Path:
    """Write ``tokenizer`` as a Hugging Face tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json``) that
    ``AutoTokenizer.from_pretrained`` and :func:`longsparse.models.tokenizer.load_tokenizer` read."""
    transformers = require("transformers", "saving the hybrid's tokenizer")
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    wrapped.save_pretrained(str(directory))
    return Path(directory)


def load_trained(path: str | Path):
    """A ``tokenizers.Tokenizer`` read from a ``tokenizer.json`` file (or the folder holding one)."""
    tk = require("tokenizers", "loading the hybrid's tokenizer")
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return tk.Tokenizer.from_file(str(path))


def eos_id(tokenizer) -> int:
    token = tokenizer.token_to_id(EOS_TOKEN)
    if token is None:
        raise ValueError(f"the tokenizer has no {EOS_TOKEN} token")
    return int(token)


class TextCodec:
    """``encode(text) -> list[int]`` / ``decode(ids) -> str`` over a ``tokenizers.Tokenizer`` (no special tokens
    added), the interface :class:`longsparse.tasks.ruler.RulerGenerator` needs."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)
