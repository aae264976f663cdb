"""Decode-time state of the Gated DeltaNet layers: their conv and recurrent states, per slot."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .kv_cache import CacheBytes


class GDNStates:
    """Per GDN layer: ``conv[layer] [slots, C, K − 1]`` (the last K − 1 conv inputs, model dtype) and
    ``recurrent[layer] [slots, HV, Dk, Dv]`` (the delta-rule state, float32). Zero means an empty sequence."""

    def __init__(
        self,
        layers: Iterable[int],
        num_slots: int,
        conv_dim: int,
        conv_kernel: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        layers = list(layers)
        self.conv = {i: torch.zeros(num_slots, conv_dim, conv_kernel - 1, dtype=dtype, device=device) for i in layers}
        self.recurrent = {
            i: torch.zeros(num_slots, num_v_heads, head_k_dim, head_v_dim, dtype=torch.float32, device=device)
            for i in layers
        }

    def reset(self, slots: list[int]) -> None:
        """Empty the states of ``slots`` (before reusing them for new sequences)."""
        for t in (*self.conv.values(), *self.recurrent.values()):
            t[slots] = 0

    def nbytes(self) -> CacheBytes:
        return CacheBytes.of([*self.conv.values(), *self.recurrent.values()])
