"""Sampling: greedy is argmax, seeded sampling repeats, top-p keeps only the nucleus in the right proportions."""

import pytest
import torch

from longsparse.engine.sampler import sample


def test_greedy_is_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample(logits), logits.argmax(-1))


def test_seeded_sampling_repeats():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    a = [sample(logits, 1.0, 1.0, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(a[0], a[1])


def test_top_p_samples_only_the_nucleus_in_proportion():
    """Probabilities 0.5, 0.3, 0.15, 0.05 with top_p 0.7: tokens 0 and 1 only, at 5:3."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().repeat(4000, 1)
    draws = sample(logits, 1.0, 0.7, torch.Generator().manual_seed(2))
    counts = torch.bincount(draws, minlength=4)
    assert counts[2] == counts[3] == 0
    assert counts[0] / 4000 == pytest.approx(0.625, abs=0.03)


def test_low_temperature_concentrates_on_the_argmax():
    logits = torch.tensor([[1.0, 1.5, 0.5]]).repeat(500, 1)
    draws = sample(logits, 0.05, 1.0, torch.Generator().manual_seed(3))
    assert (draws == 1).all()


@pytest.mark.parametrize("t, p", [(-1.0, 1.0), (1.0, 0.0), (1.0, 1.5)], ids=["neg-temp", "top-p-0", "top-p-gt-1"])
def test_bad_parameters(t, p):
    with pytest.raises(ValueError, match="temperature >= 0 and 0 < top_p <= 1"):
        sample(torch.zeros(1, 3), t, p)
