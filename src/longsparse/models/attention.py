"""Attention backends: what an attention layer calls once it has its rotated q, k and v.

Every backend takes ``q [T, H, D]``, ``k, v [T, Hkv, D]`` (packed as in :class:`~longsparse.models.batch.ForwardBatch`),
the layer index and the batch, writes k and v to the batch's KV cache, and returns ``o [T, H, D]``: causal
attention of each token over its own sequence (cached prefix included), grouped-query (query head ``h`` reads KV head
``h // (H / Hkv)``), scale ``D ** -0.5``.

``dense`` is torch SDPA. ``sparse`` and ``sparda`` are the block-sparse ops of ``longsparse.ops.sparse_attn``; they plug
in here behind the same call (SparDA also reads the previous layer's forecast from ``batch.scratch``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from .batch import ForwardBatch


class AttentionBackend(ABC):
    """Causal GQA attention of one layer over the batch; see the module docstring for the contract."""

    mode: str

    @abstractmethod
    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor: ...


class DenseAttention(AttentionBackend):
    """torch SDPA: per sequence in a prefill (a fresh sequence uses the causal kernel, one with a cached prefix an
    explicit mask); in a decode step, one call per run of consecutive cache slots (keys beyond each sequence's length
    masked)."""

    mode = "dense"

    def __call__(self, layer, q, k, v, batch):
        cache = batch.kv_cache
        if cache is not None:
            cache.store(layer, batch.token_slots, batch.positions, k, v)
        if batch.is_decode:
            if cache is None:
                raise ValueError("a decode step needs a KV cache")
            outs = []
            for start, end in _consecutive_runs(batch.slots):
                lengths = batch.context_lens[start:end]
                keys, values = cache.gather(layer, batch.slots[start:end], max(lengths))
                mask = batch.decode_mask[start:end, :, :, : max(lengths)]
                o = F.scaled_dot_product_attention(
                    q[start:end, :, None, :], keys, values, attn_mask=mask, enable_gqa=True
                )
                outs.append(o[:, :, 0, :])
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        outs = []
        for n, (start, end) in enumerate(zip(batch.offsets, batch.offsets[1:])):
            qn = q[start:end].transpose(0, 1)[None]
            prefix = batch.prefix_lens[n]
            if prefix == 0:
                kn, vn = k[start:end].transpose(0, 1)[None], v[start:end].transpose(0, 1)[None]
                o = F.scaled_dot_product_attention(qn, kn, vn, is_causal=True, enable_gqa=True)
            else:
                total = prefix + end - start
                kn, vn = cache.gather(layer, [batch.slots[n]], total)
                rows = torch.arange(prefix, total, device=q.device)[:, None]
                mask = torch.arange(total, device=q.device)[None, :] <= rows
                o = F.scaled_dot_product_attention(qn, kn, vn, attn_mask=mask, enable_gqa=True)
            outs.append(o[0].transpose(0, 1))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def _consecutive_runs(slots: list[int]) -> list[tuple[int, int]]:
    """``[(start, end)]`` ranges of ``slots`` whose slot numbers go up by one: each reads its keys as one view of the
    cache instead of a gathered copy (sequences that finish early leave gaps)."""
    runs, start = [], 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs


def make_attention_backend(mode: str) -> AttentionBackend:
    """The backend for ``mode``; ``sparse`` and ``sparda`` raise until their ops are wired in."""
    if mode == "dense":
        return DenseAttention()
    if mode in ("sparse", "sparda"):
        raise NotImplementedError(
            f"attention mode {mode!r} is not available yet: it needs the block-sparse ops of "
            "longsparse.ops.sparse_attn, which are not wired into the models in this version; use attention='dense'"
        )
    raise ValueError(f"attention mode must be one of dense, sparse, sparda, got {mode!r}")
