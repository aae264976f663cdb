"""Decode-time state: the attention layers' KV cache and the GDN layers' conv and recurrent states.

Each sequence of a generation owns a *slot*. :class:`KVCache` is the small interface the attention backends use —
store the new tokens' keys/values, read a layer's keys/values for some slots, report bytes by location — so that an
offloaded block cache (pinned host memory, 64-token blocks, SparDA part 2) can replace :class:`ContiguousKVCache`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..models.config import BaseConfig, HybridConfig


@dataclass(frozen=True)
class CacheBytes:
    """Bytes held on the GPU and in host memory."""

    gpu: int = 0
    host: int = 0

    def __add__(self, other: CacheBytes) -> CacheBytes:
        return CacheBytes(self.gpu + other.gpu, self.host + other.host)

    @classmethod
    def of(cls, tensors: Iterable[torch.Tensor]) -> CacheBytes:
        gpu = host = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if t.device.type == "cuda":
                gpu += n
            else:
                host += n
        return cls(gpu, host)


class KVCache(ABC):
    """Keys and values of attention layers for a fixed set of sequence slots."""

    @abstractmethod
    def store(
        self, layer: int, token_slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write ``k[i], v[i]`` (``[T, Hkv, D]``) at position ``positions[i]`` of slot ``token_slots[i]``."""

    @abstractmethod
    def gather(self, layer: int, slots: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[N, Hkv, length, D]`` of positions ``0 .. length − 1`` of ``slots`` (positions a slot has
        not written yet hold finite filler that the caller masks out)."""

    @abstractmethod
    def nbytes(self) -> CacheBytes:
        """Bytes this cache holds, by location."""


class ContiguousKVCache(KVCache):
    """One ``[slots, Hkv, capacity, D]`` tensor of keys and one of values per attention layer, on one device,
    zero-filled (masked positions must be finite: softmax weight 0 times NaN is NaN)."""

    def __init__(
        self,
        layers: Iterable[int],
        num_slots: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        if num_slots <= 0 or capacity <= 0:
            raise ValueError(f"num_slots and capacity must be positive, got {num_slots} and {capacity}")
        self.capacity = capacity
        shape = (num_slots, num_kv_heads, capacity, head_dim)
        self.keys = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.values = {i: torch.zeros(shape, dtype=dtype, device=device) for i in self.keys}

    def store(self, layer, token_slots, positions, k, v):
        self.keys[layer][token_slots, :, positions] = k
        self.values[layer][token_slots, :, positions] = v

    def gather(self, layer, slots, length):
        keys, values = self.keys[layer], self.values[layer]
        first = slots[0]
        if slots == list(range(first, first + len(slots))):
            return keys[first : first + len(slots), :, :length], values[first : first + len(slots), :, :length]
        index = torch.tensor(slots, device=keys.device)
        return keys[index, :, :length], values[index, :, :length]

    def nbytes(self) -> CacheBytes:
        return CacheBytes.of([*self.keys.values(), *self.values.values()])


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


def allocate_caches(
    config: BaseConfig,
    num_slots: int,
    capacity: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    kv_cache: bool = True,
) -> tuple[KVCache | None, GDNStates | None]:
    """A :class:`ContiguousKVCache` for the attention layers (``capacity`` tokens per slot; only if ``kv_cache``)
    and :class:`GDNStates` for the GDN layers; ``None`` for a kind the model does not have."""
    kv = None
    if config.attention_layers and kv_cache:
        kv = ContiguousKVCache(
            config.attention_layers, num_slots, capacity, config.num_key_value_heads, config.head_dim, dtype, device
        )
    states = None
    if isinstance(config, HybridConfig) and config.gdn_layers:
        states = GDNStates(
            config.gdn_layers,
            num_slots,
            config.gdn_conv_dim,
            config.linear_conv_kernel_dim,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
            dtype,
            device,
        )
    return kv, states
