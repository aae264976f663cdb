"""RULER's scoring rules on hand-made cases."""

import pytest

from longsparse.eval.scoring import metric_for, postprocess, score, string_match_all, string_match_part, task_score


@pytest.mark.parametrize(
    "prediction, references, expected",
    [
        ("The numbers are 123 and 456.", ["123", "456"], 1.0),
        ("The numbers are 123 and 45.", ["123", "456"], 0.5),
        ("nothing here", ["123", "456", "789", "000"], 0.0),
        ("APPLE, banana", ["apple", "Banana", "cherry"], 2 / 3),  # case-insensitive
        ("pineapple", ["apple"], 1.0),  # substring, as in RULER: no word boundaries
        ("1234567", ["123456"], 1.0),
    ],
)
def test_string_match_all(prediction, references, expected):
    assert string_match_all(prediction, references) == pytest.approx(expected)


@pytest.mark.parametrize(
    "prediction, references, expected",
    [
        ("Paris", ["paris", "Paris, France"], 1.0),
        ("It is in France", ["Paris", "Lyon"], 0.0),
        ("LYON", ["Paris", "lyon"], 1.0),
    ],
)
def test_string_match_part(prediction, references, expected):
    assert string_match_part(prediction, references) == expected


def test_postprocess_turns_control_characters_into_newlines_and_strips():
    assert postprocess("  \t 12\x0034\x1f56 \n") == "12\n34\n56"
    # a reference split by a control character no longer matches, as in RULER
    assert score("niah_single_1", " 123\x004567.", ["1234567"]) == 0.0


def test_tasks_use_rulers_metrics():
    for task in ("niah_multivalue", "vt", "cwe", "fwe"):
        assert metric_for(task) is string_match_all
    assert metric_for("qa_1") is string_match_part
    with pytest.raises(ValueError, match="unknown task"):
        metric_for("niah")


def test_task_score_is_a_percentage_mean():
    assert task_score([1.0, 0.5, 0.0, 0.25]) == pytest.approx(43.75)
    with pytest.raises(ValueError, match="no scores"):
        task_score([])
    with pytest.raises(ValueError, match="references"):
        string_match_all("x", [])
