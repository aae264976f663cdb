"""Attention backends: what an attention layer calls once it has its rotated q, k and v.

Every backend takes ``q [T, H, D]``, ``k, v [T, Hkv, D]`` (packed as in :class:`~longsparse.models.batch.ForwardBatch`),
the layer index and the batch, writes k and v to the batch's KV cache, and returns ``o [T, H, D]``: causal
attention of each token over its own sequence (cached prefix included), grouped-query (query head ``h`` reads KV head
``h // (H / Hkv)``), scale ``D ** -0.5``.

``dense`` is torch SDPA (here). ``sparse`` and ``sparda`` are the block-sparse ops of ``longsparse.ops.sparse_attn``
behind the same call (:mod:`longsparse.models.sparse_attention`; SparDA also reads the forecast an earlier layer left
in ``batch.scratch``).
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
            cache.store(layer, batch, k, v)
        if batch.is_decode:
            if cache is None:
                raise ValueError("a decode step needs a KV cache")
            outs = []
            for start, end in consecutive_runs(batch.slots):
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
            prefix = batch.prefix_lens[n]
            if prefix == 0:
                kn, vn = k[start:end].transpose(0, 1)[None], v[start:end].transpose(0, 1)[None]
            else:
                kn, vn = cache.gather(layer, [batch.slots[n]], prefix + end - start)
            outs.append(causal_sdpa(q[start:end], kn, vn, prefix))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """``q [T, H, D]`` of positions ``prefix … prefix + T − 1`` over ``k, v [1, Hkv, prefix + T, D]`` of one sequence,
    causal, through SDPA (its causal kernel when ``prefix == 0``, an explicit mask otherwise): ``[T, H, D]``."""
    qn = q.transpose(0, 1)[None]
    if prefix == 0:
        o = F.scaled_dot_product_attention(qn, k, v, is_causal=True, enable_gqa=True)
    else:
        total = k.shape[2]
        rows = torch.arange(prefix, total, device=q.device)[:, None]
        mask = torch.arange(total, device=q.device)[None, :] <= rows
        o = F.scaled_dot_product_attention(qn, k, v, attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1)


def consecutive_runs(slots: list[int]) -> list[tuple[int, int]]:
    """``[(start, end)]`` ranges of ``slots`` whose slot numbers go up by one: each reads its keys as one view of the
    cache instead of a gathered copy (sequences that finish early leave gaps)."""
    runs, start = [], 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs
