"""Capacity planning: bytes per sequence of each decode mode on the GPU and in host memory, the largest batch that
fits, and a clear refusal (:class:`CapacityError`) before anything is allocated.

The five modes of the decode comparison in SparDA (Fu et al., arXiv:2606.04511), Sec. 5.3 and Table 4, with its
no-prefetch ablation of Table 10:

| mode | selector | KV | transfers |
| --- | --- | --- | --- |
| ``dense_gpu`` (Dense†) | none (dense attention) | all on the GPU | none |
| ``sparse_gpu`` (Sparse†) | InfLLM-V2 (own queries) | all on the GPU | none |
| ``sparse_offload`` (Sparse) | InfLLM-V2 (own queries) | host; GPU slot cache | synchronous, at the layer |
| ``sparda_noprefetch`` | Forecast (previous layer) | host, first layer on the GPU | synchronous, at the layer |
| ``sparda`` (SparDA) | Forecast (previous layer) | host, first layer on the GPU | prefetched one layer early |

``sparda_gpu`` (Forecast selection, all KV on the GPU) is the GPU-resident reference of the SparDA modes.

A mode is an attention mode of the model (:mod:`longsparse.models.modes`: dense, sparse, sparda) plus a KV placement.
The GPU-resident modes are ``LLM(attention=...)``, whose ``ContiguousKVCache`` holds every block; the offloaded ones
are ``LLM(attention=..., offload="cpu")``, whose :class:`BlockKVCache` prefetches for SparDA. The cache bytes are
exactly what those caches allocate — the contiguous tensors (their capacity rounded up to whole blocks for the
block-sparse modes) or :class:`~longsparse.cache.layout.BlockLayout`'s bytes, plus the compressed keys of every
block-sparse layer (``CompressedKeys.slot_bytes``) — and scale linearly with the batch; ``step_bytes_per_seq`` is the
decode step's activations per sequence, an estimate unless a measurement replaces it (``longsparse bench decode``
measures both and records model and measurement side by side).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ops.sparse_attn import SparseAttentionConfig
from .compressed_keys import CompressedKeys
from .layout import BlockLayout


@dataclass(frozen=True)
class DecodeMode:
    """``attention``: ``dense``, ``sparse`` or ``sparda``; ``offload``: full blocks in host memory; ``prefetch``:
    copies issued one attention layer early; ``label``: the paper's name."""

    name: str
    attention: str
    offload: bool
    prefetch: bool
    label: str


DECODE_MODES: dict[str, DecodeMode] = {
    m.name: m
    for m in (
        DecodeMode("dense_gpu", "dense", False, False, "Dense†"),
        DecodeMode("sparse_gpu", "sparse", False, False, "Sparse†"),
        DecodeMode("sparse_offload", "sparse", True, False, "Sparse"),
        DecodeMode("sparda_noprefetch", "sparda", True, False, "SparDA w/o prefetch"),
        DecodeMode("sparda", "sparda", True, True, "SparDA"),
        DecodeMode("sparda_gpu", "sparda", False, False, "SparDA†"),
    )
}


def decode_mode(name: str) -> DecodeMode:
    if name not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {', '.join(DECODE_MODES)}, got {name!r}")
    return DECODE_MODES[name]


class CapacityError(ValueError):
    """A request that does not fit in GPU or host memory in its mode (raised before any allocation)."""


def offloaded_layers(mode: DecodeMode, attention_layers: tuple[int, ...]) -> tuple[int, ...]:
    """Offloaded attention layers of ``mode``: all (Sparse), all but the first (SparDA: nothing forecasts the first
    attention layer, so its KV stays on the GPU), none (GPU-resident modes)."""
    if not mode.offload:
        return ()
    return tuple(attention_layers) if mode.attention == "sparse" else tuple(attention_layers[1:])


def block_layout(
    mode: DecodeMode,
    attention_layers: tuple[int, ...],
    num_seqs: int,
    capacity: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    config: SparseAttentionConfig,
) -> BlockLayout:
    """The :class:`BlockLayout` of an offloaded ``mode``."""
    if not mode.offload:
        raise ValueError(f"decode mode {mode.name!r} keeps a contiguous cache on the GPU, not a block layout")
    return BlockLayout(
        config, tuple(attention_layers), offloaded_layers(mode, attention_layers), num_seqs, capacity,
        num_kv_heads, head_dim, dtype,
    )  # fmt: skip


@dataclass(frozen=True)
class ModeFootprint:
    """Bytes of one decode mode at one context length: per sequence on the GPU (cache) and in host memory, the
    GPU bytes that do not grow with the batch (``gpu_fixed``), and the decode step's activations per sequence."""

    mode: str
    context: int
    gpu_per_seq: int
    host_per_seq: int
    gpu_fixed: int
    step_bytes_per_seq: int

    def gpu_bytes(self, batch: int) -> int:
        return self.gpu_fixed + batch * (self.gpu_per_seq + self.step_bytes_per_seq)

    def host_bytes(self, batch: int) -> int:
        return batch * self.host_per_seq


def step_activation_bytes(hidden_size: int, intermediate_size: int, vocab_size: int, dtype: torch.dtype) -> int:
    """Estimated peak activations of one decode token: float32 logits and the sampler's copy, the MLP's three
    intermediate vectors, a handful of hidden-size vectors (residual, norms, q/k/v/o)."""
    e = dtype.itemsize
    return vocab_size * (4 + 4 + e) + 3 * intermediate_size * e + 12 * hidden_size * e


def footprint(
    mode: str | DecodeMode,
    *,
    attention_layers: tuple[int, ...],
    num_kv_heads: int,
    head_dim: int,
    context: int,
    dtype: torch.dtype,
    config: SparseAttentionConfig | None = None,
    step_bytes_per_seq: int = 0,
) -> ModeFootprint:
    """The cache footprint of ``mode`` for sequences of up to ``context`` tokens (see :class:`ModeFootprint`);
    ``config`` (the block-sparse geometry) is needed by every mode but ``dense_gpu``."""
    m = decode_mode(mode) if isinstance(mode, str) else mode
    if m.attention != "dense" and not isinstance(config, SparseAttentionConfig):
        raise ValueError(f"decode mode {m.name!r} needs config=SparseAttentionConfig, got {config!r}")
    layers = len(attention_layers)
    if m.attention == "dense":
        per_seq = layers * 2 * num_kv_heads * context * head_dim * dtype.itemsize
        return ModeFootprint(m.name, context, per_seq, 0, 0, step_bytes_per_seq)
    compressed = layers * CompressedKeys.slot_bytes(config, context, num_kv_heads, head_dim, dtype)
    if not m.offload:
        padded = config.num_blocks(context) * config.block_size
        per_seq = layers * 2 * num_kv_heads * padded * head_dim * dtype.itemsize + compressed
        return ModeFootprint(m.name, context, per_seq, 0, 0, step_bytes_per_seq)
    one, two = (block_layout(m, attention_layers, n, context, num_kv_heads, head_dim, dtype, config) for n in (1, 2))
    per_seq = two.gpu_bytes() - one.gpu_bytes()
    return ModeFootprint(
        m.name, context, per_seq + compressed, one.host_bytes(), one.gpu_bytes() - per_seq, step_bytes_per_seq
    )


def max_batch(fp: ModeFootprint, gpu_budget: int, host_budget: int | None) -> int:
    """Largest batch whose bytes fit ``gpu_budget`` and (offloaded modes) ``host_budget`` (None: unlimited)."""
    per_gpu = fp.gpu_per_seq + fp.step_bytes_per_seq
    gpu = (gpu_budget - fp.gpu_fixed) // per_gpu if per_gpu else math.inf
    host = host_budget // fp.host_per_seq if fp.host_per_seq and host_budget is not None else math.inf
    return max(0, int(min(gpu, host)))


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(fp: ModeFootprint, batch: int, gpu_budget: int | None, host_budget: int | None) -> None:
    """Raise :class:`CapacityError` unless ``batch`` sequences fit (``None`` budget: not checked)."""
    gpu_need, host_need = fp.gpu_bytes(batch), fp.host_bytes(batch)
    short = []
    if gpu_budget is not None and gpu_need > gpu_budget:
        short.append(f"{_gib(gpu_need)} of GPU memory ({_gib(gpu_budget)} free beside the model)")
    if host_budget is not None and host_need > host_budget:
        short.append(f"{_gib(host_need)} of pinned host memory ({_gib(host_budget)} available)")
    if short:
        fits = max_batch(fp, gpu_budget if gpu_budget is not None else 2**62, host_budget)
        raise CapacityError(
            f"{batch} sequences of up to {fp.context} tokens in decode mode {fp.mode!r} need "
            f"{' and '.join(short)}; at most {fits} sequences of this length fit here"
            + ("" if fp.mode != "dense_gpu" and fp.host_per_seq else "; offloading (offload='cpu') holds more")
        )


def gpu_free_bytes(device: torch.device, reserve: int) -> int | None:
    """Free memory of a CUDA ``device`` minus ``reserve`` bytes for the step's workspace; None elsewhere."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return max(0, free - reserve)


def host_available_bytes(reserve: int, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` of the host minus ``reserve`` bytes (None where ``/proc/meminfo`` is missing)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return max(0, int(line.split()[1]) * 1024 - reserve)
    except OSError:
        return None
    return None
