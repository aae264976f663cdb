import math

import pytest
import torch

from longsparse.eval.fidelity import logit_fidelity


def test_equal_logits_are_perfectly_faithful():
    logits = torch.randn(5, 11)
    f = logit_fidelity(logits, logits.clone())
    assert (f.relative_error, f.top1_agreement, f.positions) == (0.0, 1.0, 5) and abs(f.kl) < 1e-12


def test_hand_computed_case():
    """Row 0 equal; row 1 moves the top token: ‖Δ‖/‖r‖ = √2/√2, agreement 1/2, and with p = softmax(0, 1, 0),
    q = softmax(1, 0, 0) (one normaliser, e + 2): KL(p‖q) = Σ p (log p − log q) = (e − 1)/(e + 2), halved by the
    mean over the rows."""
    ref = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    other = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    f = logit_fidelity(ref, other)
    assert f.relative_error == pytest.approx(1.0) and f.top1_agreement == 0.5
    assert f.kl == pytest.approx((math.e - 1) / (math.e + 2) / 2, rel=1e-12)
    assert logit_fidelity(ref, ref + 5.0).kl == pytest.approx(0.0, abs=1e-12)  # a shift changes no probability


@pytest.mark.parametrize("shapes", [((4, 3), (4, 2)), ((4,), (4,)), ((0, 3), (0, 3))])
def test_bad_shapes_are_refused(shapes):
    with pytest.raises(ValueError, match=r"\[T, V\] logits"):
        logit_fidelity(torch.zeros(shapes[0]), torch.zeros(shapes[1]))
