"""Incremental detokenization: a request's text grown one token at a time, at a cost per token that does not grow
with the output's length, with stop strings cut and held back while they may still be forming.

A fast (Rust) tokenizer decodes through the ``tokenizers`` library's :class:`~tokenizers.decoders.DecodeStream`, which
keeps the few tokens of an unfinished character or word piece and returns text once it is complete. Any other
tokenizer decodes a window: the tokens since the last emitted text, with the few before them as context, as
vLLM does for slow tokenizers. Either way the text equals the tokenizer's decode of all output tokens (special tokens
skipped) for byte-level and word-level vocabularies.
"""

from __future__ import annotations

from ..models.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
"""What a decode of an incomplete UTF-8 sequence ends with: such text is not emitted until the sequence completes."""
WINDOW_CONTEXT = 5
"""Tokens before the new ones that the window decoder decodes with them (a word piece's leading space, a character
split over tokens)."""


def stop_holdback(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` are the start of some stop string (and may yet become one)."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold


class _StreamDecoder:
    """Text chunks of a fast tokenizer's :class:`~tokenizers.decoders.DecodeStream`."""

    def __init__(self, backend):
        from tokenizers.decoders import DecodeStream

        self.backend = backend
        self.stream = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str:
        return self.stream.step(self.backend, token_id) or ""


class _WindowDecoder:
    """Text chunks of any tokenizer with ``decode(ids)``: the tokens since ``read`` decoded after a few tokens of
    context from ``prefix``, minus the context's own text."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = self.read = 0

    def step(self, token_id: int) -> str:
        self.ids.append(token_id)
        context = self.tokenizer.decode(self.ids[self.prefix : self.read])
        text = self.tokenizer.decode(self.ids[self.prefix :])
        if len(text) <= len(context) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self.prefix = max(self.read, len(self.ids) - WINDOW_CONTEXT)
        self.read = len(self.ids)
        return text[len(context) :]


class IncrementalDetokenizer:
    """The output text of one request (``text``), cut before the first of ``stops``; :meth:`push` adds a token,
    :meth:`take` hands out the text not handed out yet.

    Stop strings are searched in the newly decoded text and the ``len(stop) − 1`` characters before it, so each
    token costs the length of its text and of the stop strings."""

    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = ()):
        backend = getattr(tokenizer.backend, "backend_tokenizer", None)
        self.decoder = _StreamDecoder(backend) if backend is not None else _WindowDecoder(tokenizer)
        self.stops = stops
        self.text = ""
        self.stopped = False
        self.emitted = 0

    def push(self, token_id: int) -> bool:
        """Add the next output token; True once a stop string has appeared (``text`` is then cut before it and
        later tokens are ignored)."""
        if self.stopped:
            return True
        chunk = self.decoder.step(token_id)
        if not chunk:
            return False
        start = len(self.text)
        self.text += chunk
        cuts = []
        for stop in self.stops:
            found = self.text.find(stop, max(0, start - len(stop) + 1))
            if found >= 0:
                cuts.append(found)
        if cuts:
            self.text = self.text[: min(cuts)]
            self.stopped = True
        return self.stopped

    def take(self, final: bool = False) -> str:
        """The text not handed out yet; unless ``final``, without a tail that may still grow into a stop string."""
        end = len(self.text)
        if not final and not self.stopped:
            end -= stop_holdback(self.text, self.stops)
        if end <= self.emitted:
            return ""
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
