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
from torch.nn.attention.bias import causal_lower_right

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
                outs.append(grouped_decode_sdpa(q[start:end], keys, values, mask))
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
    causal, through SDPA: ``[T, H, D]``. With a cached prefix the causal mask is aligned to the bottom right
    (``causal_lower_right``: query ``t`` sees keys ``0 … prefix + t``), which flash attention runs with grouped-query
    heads; an explicit boolean mask would send SDPA to its math path, which repeats K and V per query head.

    q, k and v go in heads-first (``heads_first``), not as the head-interleaved views the projections give
    (``[T, H, D]`` transposed): on the H200 (torch 2.11) a MiniCPM4-shaped model (32 q / 2 kv heads × 128) gave
    logits unrelated to transformers' and to its own float32 forward with the views. The suspect is SDPA's cuDNN
    backend, eligible at head dim 128 (not at Qwen3.5's 256, whose model matched), whose fused attention has misread
    strided grouped-query inputs before (NVIDIA TransformerEngine issue 1195); ``tests/models/test_attention_sdpa.py``
    checks this function under every backend. The copies cost ~1 % of the attention at 128K."""
    qn, k, v = heads_first(q.transpose(0, 1)[None]), heads_first(k), heads_first(v)
    if prefix == 0:
        o = F.scaled_dot_product_attention(qn, k, v, is_causal=True, enable_gqa=True)
    else:
        bias = causal_lower_right(q.shape[0], k.shape[2])
        o = F.scaled_dot_product_attention(qn, k, v, attn_mask=bias, enable_gqa=True)
    return o[0].transpose(0, 1)


def heads_first(x: torch.Tensor) -> torch.Tensor:
    """``x [..., H, T, D]`` with each head's rows consecutive (row stride D, unit last stride): ``x`` itself when it
    already is (a slice of a cache laid out ``[.., Hkv, capacity, D]``), else a contiguous copy (a transposed view of
    ``[T, H, D]``, whose rows interleave the heads)."""
    return x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous()


def grouped_decode_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One query token per sequence: ``q [N, H, D]`` over ``k, v [N, Hkv, L, D]`` where ``mask [N, 1, 1, L]`` is
    True -> ``[N, H, D]``.

    Grouped-query attention without SDPA's ``enable_gqa``: the G = H / Hkv query heads of a KV head are G query rows
    of that head (``[N, Hkv, G, D]``), the mask broadcasts over them. The same arithmetic, but SDPA's fused
    memory-efficient kernel takes a mask and no ``enable_gqa``, and flash attention takes ``enable_gqa`` and no mask:
    with both, SDPA falls back to its math path, which repeats K and V G times (in float32 for bf16 inputs)."""
    N, H, D = q.shape
    Hkv = k.shape[1]
    o = F.scaled_dot_product_attention(q.reshape(N, Hkv, H // Hkv, D), k, v, attn_mask=mask)
    return o.reshape(N, H, D)


def consecutive_runs(slots: list[int]) -> list[tuple[int, int]]:
    """``[(start, end)]`` ranges of ``slots`` whose slot numbers go up by one: each reads its keys as one view of the
    cache instead of a gathered copy (sequences that finish early leave gaps)."""
    runs, start = [], 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs
