"""Incremental detokenization: the text grown token by token equals the tokenizer's decode of all tokens (multi-byte
characters split over tokens included) through the ``tokenizers`` streaming decoder and through the window decoder of
other tokenizers, each token costs a bounded decode, and stop strings are cut and held back while they form."""

import pytest

from longsparse.engine.detokenizer import WINDOW_CONTEXT, IncrementalDetokenizer, stop_holdback
from longsparse.models.tokenizer import Tokenizer

TEXT = (
    "Gated DeltaNet keeps a fixed-size state — naïve café, 日本語のテキスト, emoji 🎉🧪 and ünïcödé.\n\n"
    "  Indented line with   spaces; numbers 12345 and symbols <>[]{}."
)


@pytest.fixture(scope="module")
def byte_level():
    """A byte-level BPE (GPT-2 / SmolLM2 style) trained on a few sentences, as transformers wraps it."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rust = RustTokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    rust.train_from_iterator([TEXT, TEXT.upper(), "the state of the art " * 5], trainer=trainer)
    return Tokenizer(PreTrainedTokenizerFast(tokenizer_object=rust, eos_token="<eos>"))


class DecodeOnly:
    """A tokenizer backend without a Rust tokenizer (takes the window path) that records what it decodes."""

    def __init__(self, tokenizer: Tokenizer):
        self.inner = tokenizer.backend
        self.lengths: list[int] = []

    def decode(self, ids, skip_special_tokens=True):
        self.lengths.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def grow(detokenizer: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    pieces = []
    for token in ids:
        detokenizer.push(token)
        pieces.append(detokenizer.take())
    pieces.append(detokenizer.take(final=True))
    return pieces


def test_stream_decoder_text_equals_the_whole_decode(byte_level):
    ids = byte_level.encode(TEXT)
    eos = byte_level.backend.convert_tokens_to_ids("<eos>")
    ids = ids[:40] + [eos] + ids[40:]  # a special token in the middle is skipped, as decode skips it
    assert len(ids) > 60
    pieces = grow(IncrementalDetokenizer(byte_level), ids)
    assert "".join(pieces) == byte_level.decode(ids) == TEXT
    assert all("\ufffd" not in p for p in pieces)  # a character split over tokens comes out whole
    assert sum(bool(p) for p in pieces) < len(ids)  # ... once its last byte arrived


def test_stream_decoder_never_decodes_the_whole_output(byte_level):
    class Refuses(Tokenizer):
        def decode(self, ids):
            raise AssertionError("decode of the output so far")

    detokenizer = IncrementalDetokenizer(Refuses(byte_level.backend))
    assert "".join(grow(detokenizer, byte_level.encode(TEXT))) == TEXT


def test_window_decoder_text_equals_the_whole_decode_at_a_bounded_cost(byte_level):
    backend = DecodeOnly(byte_level)
    ids = byte_level.encode(TEXT * 3)
    pieces = grow(IncrementalDetokenizer(Tokenizer(backend)), ids)
    assert "".join(pieces) == TEXT * 3
    assert all("\ufffd" not in p for p in pieces)
    # each decode covers the context and the tokens of one unfinished character at most, however long the output
    assert max(backend.lengths) <= WINDOW_CONTEXT + 4 and len(backend.lengths) == 2 * len(ids)


@pytest.mark.parametrize("stop", ["four", "e fo", "o t", "ve", "x", "three fou"])
def test_stop_strings_are_cut_and_nothing_after_them_is_ever_handed_out(byte_level, stop):
    text = "one two three four five"
    ids = byte_level.encode(text)
    want = text[: text.index(stop)] if stop in text else text
    detokenizer = IncrementalDetokenizer(byte_level, stops=(stop, "never seen"))
    handed, stopped = "", []
    for token in ids:
        stopped.append(detokenizer.push(token))
        handed += detokenizer.take()
        assert want.startswith(handed)  # held back while it could still become a stop string
    handed += detokenizer.take(final=True)
    assert handed == detokenizer.text == want
    if stop in text:  # the request ends at the token that completes the stop string
        first = stopped.index(True)
        assert stop in byte_level.decode(ids[: first + 1]) and stop not in byte_level.decode(ids[:first])


@pytest.mark.parametrize(
    ("text", "stops", "hold"),
    [("abc", ("cd",), 1), ("abc", ("bcx", "cd"), 2), ("abc", ("x",), 0), ("ab", ("abcdef",), 2), ("", ("a",), 0)],
)
def test_stop_holdback(text, stops, hold):
    assert stop_holdback(text, stops) == hold
