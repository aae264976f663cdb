"""Tokenizers of a checkpoint folder or a GGUF file, through transformers (never the network)."""

from __future__ import annotations

from pathlib import Path

from .._optional import require

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class Tokenizer:
    """Text ↔ token ids, the end-of-sequence ids and (if the checkpoint has one) its chat template."""

    def __init__(self, backend):
        self.backend = backend

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` without special tokens."""
        return self.backend.decode(ids, skip_special_tokens=True)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.backend.eos_token_id
        return () if eos is None else (int(eos),)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.backend, "chat_template", None))

    def chat_prompt(self, user_text: str) -> list[int]:
        """Token ids of a one-turn chat: ``user_text`` as the user's message, then the assistant's turn opened."""
        return self.chat_ids([{"role": "user", "content": user_text}])

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation (``[{"role": ..., "content": ...}, ...]``) through the checkpoint's chat
        template, then the assistant's turn opened."""
        if not self.has_chat_template:
            raise ValueError("this tokenizer has no chat template; pass the prompt without chat formatting")
        text = self.backend.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # the template already spells out the special tokens (BOS, turn markers)
        return self.encode(text, add_special_tokens=False)


def load_tokenizer(directory: Path) -> Tokenizer | None:
    """The tokenizer saved in a checkpoint folder, or ``None`` if the folder has no tokenizer files."""
    if not any((directory / name).exists() for name in TOKENIZER_FILES):
        return None
    transformers = require("transformers", "loading a tokenizer")
    return Tokenizer(transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True))


def load_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer embedded in a GGUF file, converted by transformers.

    ``PreTrainedTokenizerFast`` directly rather than ``AutoTokenizer``: the latter first re-parses the whole file's
    metadata to pick a tokenizer class (~5 s for a 49K vocabulary), and for a GGUF it picks this generic fast
    tokenizer anyway (checked for the default SmolLM2 in tests/engine/test_smollm2.py)."""
    transformers = require("transformers", "loading a GGUF tokenizer")
    require("gguf", "loading a GGUF tokenizer")
    backend = transformers.PreTrainedTokenizerFast.from_pretrained(
        str(path.parent), gguf_file=path.name, local_files_only=True
    )
    return Tokenizer(backend)
