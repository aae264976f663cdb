"""The needle and MQAR tasks of the all-GDN testbed: row layout, determinism, the splits and teacher-forced scoring."""

import numpy as np
import pytest

from longsparse.tasks.state_recall import CHUNK, Haystack, RecallTasks, RecallVocab, compose, min_length

VOCAB = RecallVocab()


@pytest.fixture(scope="module")
def haystack():
    train = " ".join(f"verse {i} of the training text." for i in range(3000))
    held = " ".join(f"line {i} held out from training." for i in range(3000))
    return Haystack.from_texts([train + held], held_out_fraction=0.5)


def test_vocab_layout():
    assert (VOCAB.first_key, VOCAB.first_value, VOCAB.query, VOCAB.end, VOCAB.size) == (256, 384, 512, 513, 514)
    with pytest.raises(ValueError, match="keys"):
        RecallVocab(keys=0)


@pytest.mark.parametrize(
    "length, pairs", [(1000, 1), (777, 16), (min_length(5), 5)], ids=["T1000-P1", "T777-P16", "T41-P5"]
)
def test_compose_places_needles_and_asks_for_each(haystack, length, pairs):
    tokens, answers, needles = compose(np.random.default_rng(3), haystack.train, length, pairs, VOCAB)
    assert tokens.shape == (length,) and tokens.dtype == np.int64
    keys_asked = tokens[answers - 1]
    assert ((keys_asked >= VOCAB.first_key) & (keys_asked < VOCAB.first_value)).all()
    assert (tokens[answers - 2] == VOCAB.query).all()
    assert len(set(keys_asked.tolist())) == pairs
    # each answer is the value that followed its key in the haystack
    assert (tokens[needles - 1] == keys_asked).all() and (tokens[needles] == tokens[answers]).all()
    assert (needles < length - 3 * pairs).all() and answers.min() == length - 3 * pairs + 2
    haystack_part = np.delete(tokens[: length - 3 * pairs], np.concatenate([needles - 1, needles]))
    assert (haystack_part < 256).all() and haystack_part.size == length - 5 * pairs


def test_compose_rejects_rows_too_short_or_too_many_pairs(haystack):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="at least 96 tokens"):
        compose(rng, haystack.train, 95, 16, VOCAB)
    with pytest.raises(ValueError, match="pairs must be in"):
        compose(rng, haystack.train, 5000, 129, VOCAB)


def test_samples_are_deterministic_and_the_splits_differ(haystack):
    tasks = RecallTasks(haystack, seed=42)
    a, b = tasks.sample("mqar", 1024, 3), tasks.sample("mqar", 1024, 3)
    assert np.array_equal(a.tokens, b.tokens) and a.id == "mqar-1024-3" and a.answer_positions.size == 16
    assert not np.array_equal(a.tokens, tasks.sample("mqar", 1024, 4).tokens)
    assert not np.array_equal(a.tokens, RecallTasks(haystack, seed=43).sample("mqar", 1024, 3).tokens)
    niah = tasks.sample("niah", 2048, 0)
    assert niah.answer_positions.size == 1 and niah.tokens.size == 2048
    held = bytes(tasks.text(500, 0).astype(np.uint8)).decode()
    train = bytes(tasks.text(500, 0, split="train").astype(np.uint8)).decode()
    assert "held out" in held and "training" in train and "held out" not in train
    assert np.array_equal(niah.needle_offsets, niah.needle_positions % CHUNK)


def test_score_is_the_share_of_values_predicted(haystack):
    sample = RecallTasks(haystack, seed=1, pairs=4).sample("mqar", 300, 0)
    perfect = np.roll(sample.tokens, -1)  # predictions[t] = the token at t + 1
    assert sample.score(perfect) == 1.0
    wrong = perfect.copy()
    wrong[sample.answer_positions[:3] - 1] = 0
    assert sample.score(wrong) == 0.25 and sample.hits(wrong).tolist() == [False, False, False, True]


def test_haystack_round_trip(tmp_path, haystack):
    path = tmp_path / "h.npz"
    haystack.save(path)
    again = Haystack.load(path)
    assert np.array_equal(again.train, haystack.train) and np.array_equal(again.held_out, haystack.held_out)
    with pytest.raises(ValueError, match="split"):
        haystack.part("test")
