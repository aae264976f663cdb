"""Putting a model into one of the decode modes of :mod:`longsparse.cache.capacity`: its attention backend, its
Forecast heads and its KV cache, sized and checked against the memory there is."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.hooks import RemovableHandle

from ..cache import (
    BlockKVCache,
    DecodeMode,
    HostBuffer,
    ModeFootprint,
    block_layout,
    check_fits,
    decode_mode,
    footprint,
    max_batch,
)
from ..cache.capacity import gpu_free_bytes, host_available_bytes, step_activation_bytes
from ..models.attention import DenseAttention
from ..models.base import CausalLM
from ..models.forecast_heads import ForecastHeads
from ..ops.sparse_attn import SparseAttentionConfig
from .block_attention import BlockSparseAttention, install_attention
from .cache import ContiguousKVCache, KVCache

GPU_RESERVE = 1 << 30
"""GPU bytes kept free beside the cache for the step's workspace and allocator slack."""
HOST_RESERVE = 4 << 30
"""Host bytes left to the operating system and the process when pinning."""


@dataclass
class ModeSetup:
    """A model prepared for ``mode``: the hooks that feed its Forecast heads (removed by :meth:`detach`)."""

    mode: DecodeMode
    sparse_config: SparseAttentionConfig
    hooks: list[RemovableHandle] = field(default_factory=list)

    def detach(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks.clear()


def prepare_model(
    model: CausalLM,
    mode: str | DecodeMode,
    sparse_config: SparseAttentionConfig,
    *,
    forecast: ForecastHeads | None = None,
    use_kernel: bool | None = None,
) -> ModeSetup:
    """Install ``mode``'s attention backend on every attention layer of ``model`` (and attach ``forecast``, which
    the SparDA modes require)."""
    m = decode_mode(mode) if isinstance(mode, str) else mode
    layers = model.config.attention_layers
    if not layers:
        raise ValueError("the model has no attention layers: there is no KV cache to place")
    setup = ModeSetup(m, sparse_config)
    if m.attention == "dense":
        install_attention(model, DenseAttention())
        return setup
    if m.attention == "sparda":
        if forecast is None:
            raise ValueError(
                f"decode mode {m.name!r} needs Forecast heads (ForecastHeads.load(path, ...), or "
                "ForecastHeads.for_config(config).randomize(seed) for a benchmark)"
            )
        setup.hooks = forecast.attach(model)
    install_attention(model, BlockSparseAttention(m.attention, sparse_config, layers, use_kernel=use_kernel))
    return setup


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


def memory_budgets(device: torch.device, host_buffer: HostBuffer | None) -> tuple[int | None, int | None]:
    """(GPU bytes free for a cache, host bytes available for pinning; None = not checked). A host buffer already
    pinned counts as available."""
    gpu = gpu_free_bytes(device, GPU_RESERVE)
    host = host_available_bytes(HOST_RESERVE)
    if host is not None and host_buffer is not None:
        host += host_buffer.nbytes
    return gpu, host


def largest_batch(
    model_config, mode: str | DecodeMode, context: int, dtype: torch.dtype,
    sparse_config: SparseAttentionConfig | None, device: torch.device, host_buffer: HostBuffer | None = None,
) -> int:  # fmt: skip
    """The most sequences of ``context`` tokens that ``mode`` can decode with the memory free now (``sparse_config``
    may be None for ``dense_gpu``; on a CPU device the GPU side is unlimited)."""
    gpu, host = memory_budgets(device, host_buffer)
    fp = mode_footprint(model_config, mode, context, dtype, sparse_config)
    return max_batch(fp, gpu if gpu is not None else 2**62, host if fp.host_per_seq else None)


def build_cache(
    model_config,
    mode: str | DecodeMode,
    num_seqs: int,
    capacity: int,
    dtype: torch.dtype,
    device: torch.device | str,
    sparse_config: SparseAttentionConfig,
    *,
    host_buffer: HostBuffer | None = None,
    num_ctas: int | None = None,
    use_kernel: bool | None = None,
    check_memory: bool = True,
    streams=None,
) -> KVCache:
    """``mode``'s KV cache for ``num_seqs`` sequences of up to ``capacity`` tokens; with ``check_memory`` a request
    that does not fit raises :class:`~longsparse.cache.CapacityError` before anything is allocated."""
    m = decode_mode(mode) if isinstance(mode, str) else mode
    device = torch.device(device)
    if check_memory:
        gpu, host = memory_budgets(device, host_buffer)
        fp = mode_footprint(model_config, m, capacity, dtype, sparse_config)
        check_fits(fp, num_seqs, gpu, host if m.offload else None)
    layers = model_config.attention_layers
    if m.attention == "dense":
        return ContiguousKVCache(
            layers, num_seqs, capacity, model_config.num_key_value_heads, model_config.head_dim, dtype, device
        )
    layout = block_layout(
        m, layers, num_seqs, capacity, model_config.num_key_value_heads, model_config.head_dim, dtype, sparse_config
    )
    return BlockKVCache(
        layout, device, prefetch=m.prefetch, streams=streams, host_buffer=host_buffer, num_ctas=num_ctas,
        use_kernel=use_kernel,
    )  # fmt: skip
