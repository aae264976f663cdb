"""Token counting and fitting a prompt to a budget with a cheap estimate and few exact measurements."""

import pytest

from longsparse.tasks.tokens import TokenCounter, fit_to_budget

from .fakes import RegexTokenizer


def test_pieces_subtract_the_tokens_every_encoding_adds():
    class WithBos(RegexTokenizer):
        def encode(self, text):
            return [0] + super().encode(text)

    counter = TokenCounter(WithBos())
    assert counter.count("") == 1 and counter.count(" a b") == 3
    assert counter.piece(" a b") == 2 and list(counter.pieces([" a", " b c", ""])) == [1, 2, 0]


def test_rejects_objects_without_encode():
    with pytest.raises(ValueError, match="encode"):
        TokenCounter(object())


@pytest.mark.parametrize("offset", [-7, 0, 5], ids=["under", "exact", "over"])
@pytest.mark.parametrize("budget", [0, 1, 99, 1000, 2997])
def test_fit_finds_the_largest_fitting_count_with_few_measurements(budget, offset):
    """Units of 3 tokens, a fixed part of 10; the estimate is off by ``offset`` tokens (the measurement is true)."""
    calls = []

    def measure(n):
        calls.append(n)
        return 10 + 3 * n

    if budget < 10:
        with pytest.raises(ValueError, match="cannot fit"):
            fit_to_budget(lambda n: 10 + 3 * n + offset, measure, budget, 5000)
        return
    n, size = fit_to_budget(lambda n: 10 + 3 * n + offset, measure, budget, 5000)
    assert (n, size) == ((budget - 10) // 3, 10 + 3 * ((budget - 10) // 3))
    assert len(calls) <= 3


def test_fit_stops_at_n_max():
    assert fit_to_budget(lambda n: n, lambda n: n, 100, 40) == (40, 40)


def test_fit_handles_a_measure_that_is_not_additive():
    # The true size grows by 2 per unit plus a jump of 9 at n >= 50: the estimate (2 per unit) is wrong past it.
    true = lambda n: 2 * n + (9 if n >= 50 else 0)  # noqa: E731
    n, size = fit_to_budget(lambda n: 2 * n, true, 104, 1000)
    assert (n, size) == (49, 98)
