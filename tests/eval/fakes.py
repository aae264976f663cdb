"""Fake models for the evaluation tests: they read the prompt like a perfect (or a broken) reader would.

``solve(prompt)`` recovers the answer of any RULER prompt we generate with regular expressions only, independently
of the generator's code, so a perfect score also proves that every prompt contains its answer. The factories have
the signature ``longsparse eval ruler --backend`` expects, e.g. ``--backend tests.eval.fakes:oracle``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass


class RegexTokenizer:
    """A fast stand-in tokenizer: words with their leading space, punctuation runs, whitespace runs."""

    _PIECES = re.compile(r" ?\w+| ?[^\w\s]+|\s+")

    def __init__(self):
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in self._PIECES.findall(text):
            if piece not in self._ids:
                self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            out.append(self._ids[piece])
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self._pieces[i] for i in ids)


def solve(prompt: str) -> str:
    """The correct answer to a generated RULER prompt, found by reading it."""
    if "special magic" in prompt:
        return _solve_niah(prompt)
    if "chain(s) of variable assignment" in prompt:
        return _solve_vt(prompt)
    if "numbered list of words" in prompt:
        return _solve_cwe(prompt)
    if "coded text" in prompt:
        return _solve_fwe(prompt)
    raise ValueError("not a RULER prompt")


def _solve_niah(prompt: str) -> str:
    question = re.findall(r"What (?:is|are all) the special magic \w+ for (.+?) mentioned in the provided", prompt)
    keys = re.split(r", and |, ", question[-1])
    values = []
    for key in keys:
        values += re.findall(r"One of the special magic \w+ for " + re.escape(key) + r" is: ([\w-]+)\.", prompt)
    return " ".join(values)


def _solve_vt(prompt: str) -> str:
    task = prompt[prompt.rindex("Memorize and track") :]
    value = re.findall(r"assigned the value (\d+) in the text above", task)[-1]
    assigned = dict(re.findall(r"VAR (\w+) = (\w+)", task))
    assigned.update({k: "VAR " + v for k, v in re.findall(r"VAR (\w+) = VAR (\w+)", task)})
    found = {k for k, v in assigned.items() if v == value}
    grew = True
    while grew:
        new = {k for k, v in assigned.items() if v.startswith("VAR ") and v[4:] in found}
        grew = not new <= found
        found |= new
    return " ".join(sorted(found))


def _solve_cwe(prompt: str) -> str:
    task = prompt[prompt.rindex("Below is a numbered list") :]
    listing = task[: task.index("\nQuestion:")]
    how_many = int(re.search(r"What are the (\d+) most common words", task).group(1))
    counts = Counter(re.findall(r"\d+\. ([a-z]+)", listing))
    return ", ".join(w for w, _ in counts.most_common(how_many))


def _solve_fwe(prompt: str) -> str:
    text = prompt[prompt.index("coded words. ") + len("coded words. ") : prompt.index("\nQuestion:")]
    counts = Counter(w for w in text.split() if w != "...")
    return ", ".join(w for w, _ in counts.most_common(3))


@dataclass
class Output:
    text: str


class OracleModel:
    """Answers every prompt correctly (greedy decoding of a perfect reader); records its calls."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer if tokenizer is not None else RegexTokenizer()
        self.calls: list[tuple[int, int, float, list]] = []

    def answer(self, prompt: str) -> str:
        return " " + solve(prompt) + "."

    def generate(self, prompts, *, max_new_tokens, temperature, stop):
        self.calls.append((len(prompts), max_new_tokens, temperature, stop))
        return [Output(self.answer(p)) for p in prompts]


class WrongModel(OracleModel):
    """Always answers with something that contains no reference."""

    def answer(self, prompt: str) -> str:
        return " I do not know."


class HalfModel(OracleModel):
    """Right on prompts whose length is even, wrong otherwise: about half the score of the oracle."""

    def answer(self, prompt: str) -> str:
        return super().answer(prompt) if len(prompt) % 2 == 0 else " I do not know."


def oracle(model, *, gdn, attention, device, dtype):
    return OracleModel()


def wrong(model, *, gdn, attention, device, dtype):
    return WrongModel()


def half(model, *, gdn, attention, device, dtype):
    return HalfModel()


def options(model, *, gdn, attention, device, dtype, **extra):
    """The oracle, remembering the extra keyword arguments it was built with (``OPTIONS``)."""
    OPTIONS.append(extra)
    return OracleModel()


OPTIONS: list[dict] = []
