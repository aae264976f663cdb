"""Attention backends: what an attention layer calls once it has its rotated q, k and v.

Every backend takes ``q [T, H, D]``, ``k, v [T, Hkv, D]`` (packed as in :class:`~longsparse.models.batch.ForwardBatch`),
the layer index, the batch and the step's :class:`~longsparse.models.plan.StepPlan` (None: a step of this call alone),
writes k and v to the batch's KV cache, and returns ``o [T, H, D]``: causal attention of each token over its own
sequence (cached prefix included), grouped-query (query head ``h`` reads KV head ``h // (H / Hkv)``), scale
``D ** -0.5``. What it reports goes to the plan's ``stats``.

``dense`` is torch SDPA (here). ``sparse`` and ``sparda`` are the block-sparse ops of ``longsparse.ops.sparse_attn``
behind the same call (:mod:`longsparse.models.sparse_attention`; SparDA also reads the forecast an earlier layer left
in the plan).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ..ops.sparse_attn import sparse_decode
from ..ops.sparse_attn.checks import use_kernels
from .batch import ForwardBatch
from .plan import StepPlan


class AttentionBackend(ABC):
    """Causal GQA attention of one layer over the batch; see the module docstring for the contract."""

    mode: str

    @abstractmethod
    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
        plan: StepPlan | None = None,
    ) -> torch.Tensor: ...  # fmt: skip


DECODE_BLOCK = 64
"""Keys per step of the split-KV decode kernel over a dense cache (whose capacity is rounded up to a multiple)."""


def dense_decode_blocks(num_seqs: int, num_kv_heads: int, max_seqlen: int, device: torch.device) -> torch.Tensor:
    """``[N, Hkv, ceil(max_seqlen / DECODE_BLOCK)]`` int32, every block number in order: the block table of a decode
    step over every block (one per step, shared by its dense layers: :attr:`StepPlan.dense_decode_blocks
    <longsparse.models.plan.StepPlan.dense_decode_blocks>`)."""
    blocks = -(-max_seqlen // DECODE_BLOCK)
    table = torch.arange(blocks, device=device, dtype=torch.int32).expand(num_seqs, num_kv_heads, blocks)
    return table.contiguous()


class DenseAttention(AttentionBackend):
    """torch SDPA for a prefill (per sequence: a fresh sequence uses the causal kernel, one with a cached prefix the
    bottom-right causal mask). A decode step runs the split-KV kernel of
    :func:`~longsparse.ops.sparse_attn.sparse_decode` over every block up to each sequence's length (see
    :meth:`_decode`); where it cannot run, SDPA, one call per run of consecutive cache slots (keys beyond each
    sequence's length masked).

    ``decode_kernel``: None uses the kernel on a GPU when the KV cache holds every block there with a capacity that
    is a multiple of :data:`DECODE_BLOCK`; True requires it (Triton's interpreter on the CPU: tests); False: SDPA.
    """

    mode = "dense"

    def __init__(self, decode_kernel: bool | None = None):
        self.decode_kernel = decode_kernel

    def __call__(self, layer, q, k, v, batch, plan=None):
        cache = batch.kv_cache
        if cache is not None:
            cache.store(layer, batch, k, v)
        if batch.is_decode:
            if cache is None:
                raise ValueError("a decode step needs a KV cache")
            return self._decode(layer, q, k.shape[1], cache, batch, plan if plan is not None else StepPlan())
        outs = []
        for n, (start, end) in enumerate(zip(batch.offsets, batch.offsets[1:])):
            prefix = batch.prefix_lens[n]
            if prefix == 0:
                kn, vn = k[start:end].transpose(0, 1)[None], v[start:end].transpose(0, 1)[None]
            else:
                kn, vn = cache.gather(layer, [batch.slots[n]], prefix + end - start)
            outs.append(causal_sdpa(q[start:end], kn, vn, prefix))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _decode(self, layer, q, num_kv_heads, cache, batch, plan):
        """Why a kernel of our own: SDPA has no decode kernel that reads a cache up to per-sequence lengths. Its
        memory-efficient kernel (the one that takes the key mask) gives each (sequence, head) one program over all
        keys — at B = 1 and 128K context, 4 programs per layer on 132 multiprocessors (64 ms per Qwen3.5-4B step
        on the H200); flash attention splits the keys but takes no mask, so it cannot skip a shorter
        sequence's unwritten tail, and a CUDA graph (which reads the cache's whole capacity) could not use it. The
        split-KV kernel cuts each (sequence, KV head)'s blocks into ~2 programs per multiprocessor, folds the G query
        heads into its MMA rows, reads ``batch.seqlens`` on the device (graph-safe; keys past a sequence's length are
        masked loads, never read), and takes any set of slots. Its block table is the plan's (built here, once per
        plan, when the step was not planned for it)."""
        if self._use_kernel(q, cache):
            block_ids = plan.dense_decode_blocks
            if block_ids is None:
                block_ids = plan.dense_decode_blocks = dense_decode_blocks(
                    q.shape[0], num_kv_heads, batch.max_seqlen, q.device
                )
            k_slots, v_slots, table = cache.block_slots(layer, batch, block_ids, DECODE_BLOCK)
            out = sparse_decode(q, k_slots, v_slots, table, block_ids, batch.seqlens, use_kernel=True)
            cache.release(layer)
            return out
        outs = []
        for start, end in consecutive_runs(batch.slots):
            lengths = batch.context_lens[start:end]
            keys, values = cache.gather(layer, batch.slots[start:end], max(lengths))
            mask = batch.decode_mask[start:end, :, :, : max(lengths)]
            outs.append(grouped_decode_sdpa(q[start:end], keys, values, mask))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _use_kernel(self, q: torch.Tensor, cache) -> bool:
        return self.uses_decode_kernel(cache, q.device, q.dtype)

    def uses_decode_kernel(self, cache, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether a decode step over ``cache`` with queries of ``dtype`` on ``device`` runs the split-KV kernel
        (ValueError where ``decode_kernel=True`` cannot)."""
        fits = cache.resident and cache.capacity % DECODE_BLOCK == 0
        if self.decode_kernel is None:
            return fits and device.type == "cuda" and use_kernels(device, dtype, None)
        if self.decode_kernel and not fits:
            raise ValueError(
                "decode_kernel=True needs a KV cache that holds every block on the device with a capacity that is a "
                f"multiple of {DECODE_BLOCK} (ContiguousKVCache(..., block_size={DECODE_BLOCK}))"
            )
        return self.decode_kernel


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> torch.Tensor:
    """``q [T, H, D]`` of positions ``prefix … prefix + T − 1`` over ``k, v [1, Hkv, prefix + T, D]`` of one sequence,
    causal, through SDPA: ``[T, H, D]``. With a cached prefix the causal mask is aligned to the bottom right
    (``causal_lower_right``: query ``t`` sees keys ``0 … prefix + t``), which flash attention runs with grouped-query
    heads; an explicit boolean mask would send SDPA to its math path, which repeats K and V per query head.

    q, k and v may be the strided views the projections give (``[T, H, D]`` transposed, heads interleaved in memory):
    every SDPA backend reads those correctly (``tests/models/test_attention_sdpa.py`` checks each on the GPU)."""
    qn = q.transpose(0, 1)[None]
    if prefix == 0:
        o = F.scaled_dot_product_attention(qn, k, v, is_causal=True, enable_gqa=True)
    else:
        bias = causal_lower_right(q.shape[0], k.shape[2])
        o = F.scaled_dot_product_attention(qn, k, v, attn_mask=bias, enable_gqa=True)
    return o[0].transpose(0, 1)


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
