"""Allocating a model's decode-time state: the KV cache, the GDN layers' states and the block-sparse layers'
compressed keys, shaped from the model's config (the types live in :mod:`longsparse.cache`; they are re-exported here
for code written against this module)."""

from __future__ import annotations

import torch

from ..cache import CacheBytes, CompressedKeys, ContiguousKVCache, GDNStates, KVCache
from ..models.base import CausalLM
from ..models.config import BaseConfig, HybridConfig

__all__ = [
    "CacheBytes",
    "CompressedKeys",
    "ContiguousKVCache",
    "GDNStates",
    "KVCache",
    "allocate_caches",
    "allocate_compressed_keys",
]


def allocate_caches(
    config: BaseConfig,
    num_slots: int,
    capacity: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    block_size: int | None = None,
    kv_cache: bool = True,
) -> tuple[KVCache | None, GDNStates | None]:
    """A :class:`ContiguousKVCache` for the attention layers (``capacity`` tokens per slot, rounded up to a multiple
    of ``block_size`` if given, as block-sparse decoding needs; none when ``kv_cache`` is False, for a caller that
    builds another KV cache) and :class:`GDNStates` for the GDN layers; ``None`` for a kind the model does not have."""
    kv = None
    if config.attention_layers and kv_cache:
        kv = ContiguousKVCache(
            config.attention_layers, num_slots, capacity, config.num_key_value_heads, config.head_dim, dtype, device,
            block_size=block_size,
        )  # fmt: skip
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


def allocate_compressed_keys(model: CausalLM, num_slots: int, capacity: int) -> CompressedKeys | None:
    """:class:`CompressedKeys` for ``model``'s block-sparse attention layers (``capacity`` tokens per slot), in its
    dtype on its device, for the KV heads it holds (its rank's under tensor parallelism); ``None`` when every attention
    layer is dense."""
    config = model.sparse_attention_config
    if not model.sparse_attention_layers or config is None:
        return None
    weight = model.lm_head.weight
    return CompressedKeys(
        model.sparse_attention_layers,
        num_slots,
        capacity,
        model.rank_config.num_key_value_heads,
        model.rank_config.head_dim,
        config,
        weight.dtype,
        weight.device,
    )
