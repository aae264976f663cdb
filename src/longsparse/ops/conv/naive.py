"""Pure-torch reference of the short causal convolution (one ``F.conv1d`` per sequence)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    offsets: list[int],
    initial_states: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, C]`` packed sequences delimited by the host list ``offsets`` (N + 1 entries), ``weight [C, W]``,
    ``initial_states [N, C, W − 1]`` (None: zeros) -> ``(y [T, C], final_states [N, C, W − 1])``, both in ``x``'s
    dtype; computed in ``x``'s dtype like a model's own ``nn.Conv1d``."""
    C, W = weight.shape
    outs, finals = [], []
    for n, (start, end) in enumerate(zip(offsets, offsets[1:])):
        prev = x.new_zeros(C, W - 1) if initial_states is None else initial_states[n].to(x.dtype)
        inp = torch.cat([prev, x[start:end].T], dim=1)  # [C, W - 1 + T_n]
        if end > start:  # an empty sequence has no output and keeps its state
            outs.append(F.conv1d(inp[None], weight.to(x.dtype)[:, None, :], groups=C)[0].T)
        finals.append(inp[:, inp.shape[1] - (W - 1) :])
    y = torch.cat(outs, dim=0) if outs else x.new_empty(0, C)
    if activation == "silu":
        y = F.silu(y)
    return y, torch.stack(finals) if finals else x.new_empty(0, C, W - 1)
