"""Reading what a model's attention layers see, through the model's own forward (``ForwardBatch.attention_observer``).

Forecast training and the selection-recall diagnostics need, at every attention layer, the layer's input ``x`` (after
its input norm) and its rotated ``q`` at a few query positions, and its rotated ``k`` at every position. They run the
model unchanged and keep those tensors as each layer passes them to its attention backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CausalLM
from .batch import ForwardBatch


@dataclass(frozen=True)
class AttentionCapture:
    """One attention layer on one sequence of ``T`` tokens, at ``P`` chosen query positions.

    ``x [P, hidden]``: the layer's attention input at those positions; ``q [P, H, D]``: its queries there (after q norm
    and RoPE); ``k [T, Hkv, D]``: its keys at every position (after k norm and RoPE).
    """

    x: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor


@torch.no_grad()
def capture_attention(model: CausalLM, input_ids: torch.Tensor, positions: torch.Tensor) -> dict[int, AttentionCapture]:
    """Run ``model`` on one sequence ``input_ids [T]`` (a stateless prefill) and return, per attention layer index,
    its :class:`AttentionCapture` at the query ``positions [P]`` (int64, in ``[0, T)``)."""
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise ValueError(f"input_ids must be one non-empty sequence [T], got shape {list(input_ids.shape)}")
    T = input_ids.shape[0]
    if positions.dim() != 1 or positions.dtype != torch.int64:
        raise ValueError(f"positions must be a [P] int64 tensor, got {positions.dtype} {list(positions.shape)}")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= T):
        raise ValueError(f"positions must lie in [0, T={T}), got {int(positions.min())} .. {int(positions.max())}")
    device = model.lm_head.weight.device
    positions = positions.to(device)
    captures: dict[int, AttentionCapture] = {}

    def observe(layer: int, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        captures[layer] = AttentionCapture(x[positions].clone(), q[positions].clone(), k.clone())

    batch = ForwardBatch.prefill([T], device)
    batch.attention_observer = observe
    model(input_ids.to(device), batch)
    return captures
