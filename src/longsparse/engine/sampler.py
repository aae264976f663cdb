"""Next-token choice from logits: greedy, or temperature with nucleus (top-p) filtering."""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``[N]`` int64 tokens from ``logits [N, vocab]``.

    ``temperature == 0``: argmax. Otherwise softmax of ``logits / temperature``, restricted to the smallest set of
    most likely tokens whose probability reaches ``top_p`` (at least one token), renormalised and sampled.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, vocab], got shape {list(logits.shape)}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature} and {top_p}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
