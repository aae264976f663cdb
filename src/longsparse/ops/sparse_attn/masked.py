"""Block-sparse prefill and decode as dense SDPA under the boolean mask of the selected blocks.

The torch path of :func:`~longsparse.ops.sparse_attn.block_sparse_attention` and
:func:`~longsparse.ops.sparse_attn.sparse_decode` (where the Triton kernels do not run: the CPU, or
``use_kernel=False``). Attention restricted to a query's blocks *is* dense attention under the mask "key in a
selected block and causal", so these functions build that mask and let torch's fused SDPA compute it, instead of
materialising the ``[Hq, T, T]`` probabilities as the float64 specification (``naive.sparse_attention_ref``) does.
The result equals the specification (tested on odd lengths, several group sizes, empty lists, duplicates).

GQA without repeating K and V: the ``G`` query heads of a KV head become ``G`` groups of query rows of that head
(``[B, Hkv, G·C, d]``), and the mask, shared by the group, is repeated over those rows. A prefill runs ``chunk``
query rows at a time against the keys up to the chunk's end, so that the mask stays ``[B, Hkv, G·chunk, T]``.
A query that attends no key gets zeros, as in the specification.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_CHUNK = 512


def _selected_blocks(block_idx: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """``[..., S]`` block lists (−1 padded, entries past ``num_blocks`` ignored) -> ``[..., num_blocks]`` bool."""
    hit = torch.zeros(*block_idx.shape[:-1], num_blocks + 1, dtype=torch.bool, device=block_idx.device)
    outside = (block_idx < 0) | (block_idx >= num_blocks)
    hit.scatter_(-1, torch.where(outside, num_blocks, block_idx.long()), True)
    return hit[..., :num_blocks]


def masked_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    block_size: int,
    scale: float,
    *,
    chunk: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """Causal attention of ``q [B, T, Hq, d]`` over ``k, v [B, T, Hkv, d]`` restricted to ``block_idx [B, T, Hkv,
    S]`` (−1 padded): ``[B, T, Hq, d]`` in ``q``'s dtype."""
    B, T, Hq, d = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    nb = -(-T // block_size)
    selected = _selected_blocks(block_idx, nb).permute(0, 2, 1, 3)  # [B, Hkv, T, nb]
    key_block = torch.arange(T, device=q.device) // block_size
    # a row attends some key iff it selected a block at or before its own (that block's first key is causal)
    attends = (selected & (torch.arange(nb, device=q.device) <= key_block[:, None])).any(-1)  # [B, Hkv, T]
    qh = q.permute(0, 2, 1, 3).reshape(B, Hkv, G, T, d)
    kh, vh = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
    out = torch.empty(B, Hkv, G, T, d, dtype=q.dtype, device=q.device)
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        C = e - s
        causal = torch.arange(e, device=q.device)[None, :] <= torch.arange(s, e, device=q.device)[:, None]
        mask = selected[:, :, s:e][..., key_block[:e]] & causal  # [B, Hkv, C, e]
        rows = mask[:, :, None].expand(B, Hkv, G, C, e).reshape(B, Hkv, G * C, e)
        o = F.scaled_dot_product_attention(
            qh[:, :, :, s:e].reshape(B, Hkv, G * C, d), kh[:, :, :e], vh[:, :, :e], attn_mask=rows, scale=scale
        )
        out[:, :, :, s:e] = o.view(B, Hkv, G, C, d).masked_fill(~attends[:, :, None, s:e, None], 0.0)
    return out.view(B, Hq, T, d).transpose(1, 2)


def masked_decode(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    block_table: torch.Tensor,
    block_ids: torch.Tensor,
    seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One decode step over a block-slot cache (layout of ``decode.py``): the listed blocks are gathered per (sequence,
    KV head) and attended under the mask "valid entry and position < seqlens": ``q [B, Hq, d]`` -> ``[B, Hq, d]``."""
    B, Hq, d = q.shape
    Hkv, S = block_table.shape[1:]
    G = Hq // Hkv
    blk = k_slots.shape[1]
    valid = (block_table >= 0) & (block_ids >= 0)
    slots = torch.where(valid, block_table, 0).long()
    keys = k_slots[slots].reshape(B, Hkv, S * blk, d)
    values = v_slots[slots].reshape(B, Hkv, S * blk, d)
    positions = block_ids.long()[..., None] * blk + torch.arange(blk, device=q.device)
    keep = valid[..., None] & (positions < seqlens.long()[:, None, None, None])
    mask = keep.view(B, Hkv, 1, S * blk)
    o = F.scaled_dot_product_attention(q.reshape(B, Hkv, G, d), keys, values, attn_mask=mask, scale=scale)
    o = o.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return o.reshape(B, Hq, d)
