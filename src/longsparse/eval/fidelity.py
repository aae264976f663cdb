"""Logit fidelity: how far an approximate execution mode (SparseGDN, block-sparse attention) moves a model's
next-token logits from a reference mode's on the same prompt, over every prompt position.

Task scores saturate: a small model can answer every sample right under two modes whose logits differ, and then a
RULER comparison cannot tell a good selection from a random one. These per-position measures see the difference before
it changes an answer (``scripts/gdn_fidelity.py`` runs them over RULER prompts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class LogitFidelity:
    """``relative_error``: ``‖other − reference‖ / ‖reference‖`` over all ``[T, V]`` logits; ``kl``: the mean over
    positions of KL(softmax(reference) ‖ softmax(other)) in nats; ``top1_agreement``: the share of positions whose
    argmax token is the same; ``positions``: T."""

    relative_error: float
    kl: float
    top1_agreement: float
    positions: int

    def as_dict(self) -> dict:
        return asdict(self)


def logit_fidelity(reference: torch.Tensor, other: torch.Tensor) -> LogitFidelity:
    """``reference``, ``other``: ``[T, V]`` logits of the same prompt (any float dtype; computed in float64)."""
    if reference.ndim != 2 or reference.shape != other.shape or reference.shape[0] == 0:
        raise ValueError(
            f"reference and other must be [T, V] logits of one shape with T >= 1, got {tuple(reference.shape)} "
            f"and {tuple(other.shape)}"
        )
    ref, oth = reference.detach().double(), other.detach().to(reference.device).double()
    log_p, log_q = ref.log_softmax(-1), oth.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    agree = (ref.argmax(-1) == oth.argmax(-1)).double().mean()
    rel = (oth - ref).norm() / ref.norm()
    return LogitFidelity(float(rel), float(kl), float(agree), int(ref.shape[0]))
