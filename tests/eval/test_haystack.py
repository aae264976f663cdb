"""Haystack corpora read from the packages that ship them, and the word lists for needle keys."""

import re

import numpy as np
import pytest

from longsparse.tasks.haystack import CORPORA, Corpus, load_corpus
from longsparse.tasks.words import ADJECTIVES, NOUNS


@pytest.fixture(scope="module", params=CORPORA)
def corpus(request):
    return load_corpus(request.param)


def test_corpus_is_a_long_clean_text(corpus):
    assert len(corpus.words) > 700_000  # both texts are far longer than a 128K-token haystack
    text = " ".join(corpus.words[:200_000])
    for markup in ("**", "#", "_", "[", "]", "\\", "{", "}"):
        assert markup not in text, markup
    assert corpus.clause_starts[0]
    first_words = [corpus.words[i] for i in np.flatnonzero(corpus.clause_starts[:50_000])]
    assert sum(w[0].isupper() for w in first_words) > 0.5 * len(first_words)


def test_known_openings(corpus):
    text = " ".join(corpus.words[:200_000])
    if corpus.name == "kjv":
        assert text.startswith("In the beginning God created the heaven and the earth. And")
    else:
        assert "Now, fair Hippolyta, our nuptial hour" in text
        assert "HIPPOLYTA" not in text  # speaker names are dropped


def test_clause_starts_follow_clause_ends():
    c = Corpus.from_text("t", 'He said: "Go." Then he went; and she "stayed?" (yes) Fine')
    starts = [w for w, s in zip(c.words, c.clause_starts) if s]
    assert starts == ["He", '"Go."', "Then", "and", "(yes)"]


def test_vocabulary_is_sorted_lowercase_words(corpus):
    vocab = corpus.vocabulary()
    assert vocab == sorted(set(vocab)) and len(vocab) > 7000
    assert all(re.fullmatch(r"[a-z]{3,12}", w) for w in vocab)


def test_needle_keys_never_occur_in_the_haystacks(corpus):
    hyphenated = {w.strip(".,;:?!'\"()").lower() for w in corpus.words if "-" in w}
    keys = {f"{a}-{n}" for a in ADJECTIVES for n in NOUNS}
    assert not hyphenated & keys
    assert len(keys) == len(ADJECTIVES) * len(NOUNS) > 30_000


def test_bad_corpus_arguments():
    with pytest.raises(ValueError, match="corpus must be one of"):
        load_corpus("essays")
    with pytest.raises(ValueError, match="no words"):
        Corpus.from_text("empty", "  ")
    with pytest.raises(ValueError, match="clause_starts"):
        Corpus("x", ("a", "b"), np.array([True]))
