"""Putting a model into one of the decode modes of :mod:`longsparse.cache.capacity` — its attention modes (set, like
every mode, through :meth:`~longsparse.models.base.CausalLM.set_modes`) and its KV cache, sized and checked against
the memory there is. ``LLM`` picks its mode from ``attention`` and ``offload``; ``longsparse bench decode`` and the
tests switch one model between all of them."""

from __future__ import annotations

import torch

from ..cache import (
    BlockKVCache,
    ContiguousKVCache,
    DecodeMode,
    HostBuffer,
    KVCache,
    ModeFootprint,
    block_layout,
    check_fits,
    decode_mode,
    footprint,
    max_batch,
)
from ..cache.capacity import gpu_free_bytes, host_available_bytes, step_activation_bytes
from ..models.attention import DECODE_BLOCK
from ..models.base import CausalLM
from ..models.forecast import ForecastProjections
from ..models.modes import ExecutionModes
from ..ops.sparse_attn import SparseAttentionConfig

GPU_RESERVE = 1 << 30
"""GPU bytes kept free beside the cache for the step's workspace and allocator slack."""
HOST_RESERVE = 4 << 30
"""Host bytes left to the operating system and the process when pinning."""


def _mode(mode: str | DecodeMode) -> DecodeMode:
    return decode_mode(mode) if isinstance(mode, str) else mode


def prepare_model(
    model: CausalLM,
    mode: str | DecodeMode,
    sparse_config: SparseAttentionConfig | None = None,
    *,
    forecast: ForecastProjections | None = None,
) -> None:
    """Set every attention layer of ``model`` to ``mode``'s attention mode and every GDN layer to ``dense``
    (``sparse_config``: the block-sparse geometry; ``forecast``: the adapter the SparDA modes need, ignored by the
    others)."""
    m = _mode(mode)
    if not model.config.attention_layers:
        raise ValueError("the model has no attention layers: there is no KV cache to place")
    model.set_modes(
        ExecutionModes(attention=m.attention),
        sparse_attention_config=sparse_config,
        forecast=forecast if m.attention == "sparda" else None,
    )


def mode_footprint(
    model_config, mode: str | DecodeMode, context: int, dtype: torch.dtype, sparse_config: SparseAttentionConfig | None
) -> ModeFootprint:
    """:func:`~longsparse.cache.footprint` of ``mode`` for this model, with the estimated step activations."""
    return footprint(
        mode,
        attention_layers=model_config.attention_layers,
        num_kv_heads=model_config.num_key_value_heads,
        head_dim=model_config.head_dim,
        context=context,
        dtype=dtype,
        config=sparse_config,
        step_bytes_per_seq=step_activation_bytes(
            model_config.hidden_size, model_config.intermediate_size, model_config.vocab_size, dtype
        ),
    )


def memory_budgets(
    device: torch.device, host_buffer: HostBuffer | None, host_ranks: int = 1
) -> tuple[int | None, int | None]:
    """(GPU bytes free for a cache, host bytes available for pinning; None = not checked). A host buffer already
    pinned counts as available. ``host_ranks``: the tensor-parallel ranks on this host, each of which pins its own
    share of the memory available."""
    gpu = gpu_free_bytes(device, GPU_RESERVE)
    host = host_available_bytes(HOST_RESERVE)
    if host is not None:
        host //= host_ranks
    if host is not None and host_buffer is not None:
        host += host_buffer.nbytes
    return gpu, host


def largest_batch(
    model_config, mode: str | DecodeMode, context: int, dtype: torch.dtype,
    sparse_config: SparseAttentionConfig | None, device: torch.device, host_buffer: HostBuffer | None = None,
    host_ranks: int = 1,
) -> int:  # fmt: skip
    """The most sequences of ``context`` tokens that ``mode`` can decode with the memory free now (``sparse_config``
    may be None for ``dense_gpu``; on a CPU device the GPU side is unlimited); ``host_ranks``: see
    :func:`memory_budgets` (``model_config`` is then the rank's)."""
    gpu, host = memory_budgets(device, host_buffer, host_ranks)
    fp = mode_footprint(model_config, mode, context, dtype, sparse_config)
    return max_batch(fp, gpu if gpu is not None else 2**62, host if fp.host_per_seq else None)


def build_cache(
    model_config,
    mode: str | DecodeMode,
    num_seqs: int,
    capacity: int,
    dtype: torch.dtype,
    device: torch.device | str,
    sparse_config: SparseAttentionConfig | None,
    *,
    host_buffer: HostBuffer | None = None,
    num_ctas: int | None = None,
    check_memory: bool = True,
    streams=None,
    host_ranks: int = 1,
) -> KVCache:
    """``mode``'s KV cache for ``num_seqs`` sequences of up to ``capacity`` tokens: a :class:`ContiguousKVCache` for
    the GPU-resident modes (whole blocks for the block-sparse ones), a :class:`~longsparse.cache.BlockKVCache` for the
    offloaded ones. With ``check_memory`` a request that does not fit raises
    :class:`~longsparse.cache.CapacityError` before anything is allocated. The block-sparse modes also need the
    model's :class:`~longsparse.cache.CompressedKeys` (``allocate_compressed_keys``), counted in the check. Under
    tensor parallelism ``model_config`` is the rank's (its KV heads) and ``host_ranks`` the ranks on this host, each
    checked against its share of the host's memory (:func:`memory_budgets`)."""
    m = _mode(mode)
    device = torch.device(device)
    if check_memory:
        gpu, host = memory_budgets(device, host_buffer, host_ranks)
        fp = mode_footprint(model_config, m, capacity, dtype, sparse_config)
        check_fits(fp, num_seqs, gpu, host if m.offload else None)
    layers, heads, head_dim = model_config.attention_layers, model_config.num_key_value_heads, model_config.head_dim
    if not m.offload:
        # dense decode's split-KV kernel reads whole blocks too (rounding adds < 64 tokens per slot)
        block_size = sparse_config.block_size if m.attention != "dense" else DECODE_BLOCK
        return ContiguousKVCache(layers, num_seqs, capacity, heads, head_dim, dtype, device, block_size=block_size)
    layout = block_layout(m, layers, num_seqs, capacity, heads, head_dim, dtype, sparse_config)
    return BlockKVCache(
        layout, device, prefetch=m.prefetch, streams=streams, host_buffer=host_buffer, num_ctas=num_ctas
    )
