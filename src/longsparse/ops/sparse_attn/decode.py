"""Block-sparse decode attention: one query token per sequence over blocks held in a GPU block-slot cache.

Slot-cache layout (what the offloaded cache writes; one layer):

* ``k_slots, v_slots [num_slots, block_size, d]`` — one slot holds one KV head's 64 keys (values) of one block of one
  sequence, ``block_size·d`` contiguous elements (16 KiB in bf16 for d = 128), so the UVA copy kernel moves each
  (sequence, KV head, block) of the pinned host store as one contiguous run. Slots are per KV head because each KV
  head selects its own blocks. ``k_slots`` and ``v_slots`` may be views of one ``[num_slots, 2, block, d]`` buffer
  (one 32 KiB K+V run per slot): only the slot and row strides are used, the last dim must be contiguous.
  GPU-resident KV ``[B, T, Hkv, d]`` is the special case ``k.permute(0, 2, 1, 3).reshape(B·Hkv·NB, block, d)`` of a
  ``[B, Hkv, T, d]``-contiguous cache with slot ``(b·Hkv + h)·NB + block`` (:func:`resident_slots`).
* ``block_table [B, Hkv, S]`` int32 — slot of each attended block, −1 = padding;
* ``block_ids [B, Hkv, S]`` int32 — the logical block each entry holds (the selector's list, −1 padded), so the kernel
  masks the partly filled tail block: key ``r`` of block ``n`` is at position ``n·block + r`` and is attended iff
  ``< seqlens[b]``.
* ``seqlens [B]`` int32 — tokens of each sequence including the new one (whose K/V the caller has already written
  into its tail slot). The init block, the local window and the tail block are ordinary entries of the lists.

Entries may come in any order and −1 entries anywhere. Returns ``[B, Hq, d]``; no host sync. Where the kernel does
not run, the listed blocks are gathered and attended by SDPA under the same mask (``masked.masked_decode``).
"""

from __future__ import annotations

import torch

from .._launch import fast
from .checks import check_gqa, check_same_device, check_tensor, shape_str, use_kernels
from .launch import load_kernels, next_pow2
from .masked import masked_decode

LOG2E = 1.4426950408889634

PRELOAD_MAX_RUN = 16
"""Runs of at most this many blocks (every sparse decode: 96 blocks cut into runs of 1-3, about two programs per SM)
load their block-table entries before the loop and pipeline three stages deep; longer runs (dense decode over every
block) keep the table loads in the loop at two stages. H200, 128K, B = 4, 8 calls per CUDA graph: 16.7 -> 14.8 us
per call; three stages without the preload were slower than two (17.9 us; docs/kernel-log.md)."""
PRELOAD_MAX_DIM = 128
"""Head dims up to this take the preloaded 3-stage build (72 KB of shared memory at d = 128: two programs per SM).
At d = 256 (Qwen3.5) three stages take 141 KB, one program per SM; not measured there, so d > 128 keeps the
2-stage build."""


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def sparse_decode(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    block_table: torch.Tensor,
    block_ids: torch.Tensor,
    seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    num_splits: int | None = None,
    use_kernel: bool | None = None,
) -> torch.Tensor:
    """One decode step of block-sparse attention (layout in the module docstring): ``q [B, Hq, d]`` -> ``[B, Hq, d]``.

    ``num_splits`` (default: enough programs for about two per multiprocessor) cuts each block list into runs.
    """
    check_tensor("q", q, 3, "[B, Hq, d]")
    check_tensor("k_slots", k_slots, 3, "[num_slots, block, d]")
    check_tensor("v_slots", v_slots, 3, "[num_slots, block, d]")
    check_tensor("block_table", block_table, 3, "[B, Hkv, S]", floating=False)
    check_tensor("block_ids", block_ids, 3, "[B, Hkv, S]", floating=False)
    check_tensor("seqlens", seqlens, 1, "[B]", floating=False)
    check_same_device(
        q=q, k_slots=k_slots, v_slots=v_slots, block_table=block_table, block_ids=block_ids, seqlens=seqlens
    )
    B, Hq, D = q.shape
    if k_slots.shape != v_slots.shape:
        raise ValueError(f"k_slots and v_slots must have one shape, got {shape_str(k_slots)} and {shape_str(v_slots)}")
    if k_slots.shape[2] != D:
        raise ValueError(f"slots must hold d={D} (as q {shape_str(q)}), got k_slots {shape_str(k_slots)}")
    block = k_slots.shape[1]
    if block < 16 or block & (block - 1):
        raise ValueError(f"the slot block size must be a power of two >= 16, got {block}")
    if block_table.shape != block_ids.shape or block_table.shape[0] != B:
        raise ValueError(
            f"block_table and block_ids must both be [B={B}, Hkv, S], got {shape_str(block_table)} "
            f"and {shape_str(block_ids)}"
        )
    if seqlens.shape != (B,):
        raise ValueError(f"seqlens must be [B] = [{B}], got {shape_str(seqlens)}")
    if not (q.dtype == k_slots.dtype == v_slots.dtype):
        raise ValueError(
            f"q, k_slots and v_slots must share one dtype, got {q.dtype}, {k_slots.dtype}, {v_slots.dtype}"
        )
    Hkv, S = block_table.shape[1:]
    G = check_gqa(Hq, Hkv, "q", "block_table")
    scale = D**-0.5 if scale is None else float(scale)
    if not use_kernels(q.device, q.dtype, use_kernel):
        return masked_decode(q, k_slots, v_slots, block_table, block_ids, seqlens, scale)
    for name, x in (("q", q), ("k_slots", k_slots), ("v_slots", v_slots)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim")
    block_table, block_ids = block_table.contiguous(), block_ids.contiguous()
    if num_splits is None:
        num_splits = max(1, min(S, -(-2 * _num_sms(q.device) // max(1, B * Hkv))))
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    eps = max(1, -(-S // num_splits))
    nsplit = max(1, -(-S // eps))
    o = torch.empty_like(q)
    if B * Hq == 0:
        return o
    GP = max(16, next_pow2(G))
    BD = next_pow2(D)
    kernels = load_kernels("decode")
    final = nsplit == 1
    preload = eps <= PRELOAD_MAX_RUN and BD <= PRELOAD_MAX_DIM
    acc = o if final else torch.empty(B * Hkv, nsplit, GP, BD, dtype=torch.float32, device=q.device)
    m = o if final else torch.empty(B * Hkv, nsplit, GP, dtype=torch.float32, device=q.device)
    l_ = o if final else torch.empty_like(m)
    fast(kernels.decode_fwd_kernel_split)[(B * Hkv, nsplit)](
        q, k_slots, v_slots, block_table, block_ids, seqlens, o, acc, m, l_,
        q.stride(0), q.stride(1), k_slots.stride(0), k_slots.stride(1), v_slots.stride(0), v_slots.stride(1),
        block_table.stride(0), block_table.stride(1), block_ids.stride(0), block_ids.stride(1),
        o.stride(0), o.stride(1), S, nsplit, eps, scale * LOG2E,
        HKV=Hkv, G=G, GP=GP, D=D, BD=BD, BLOCK=block, FINAL=final,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PRELOAD=preload,
        EPSP=next_pow2(eps) if preload else 1, num_warps=4, num_stages=3 if preload else 2,
    )  # fmt: skip
    if not final:
        # sized by the requested splits, not the runs this step needs: one build as the block lists grow
        nsp = next_pow2(num_splits)
        fast(kernels.decode_fwd_kernel_merge)[(B * Hkv, G)](
            acc, m, l_, o, o.stride(0), o.stride(1), nsplit,
            HKV=Hkv, G=G, GP=GP, D=D, BD=BD, NSP=nsp, num_warps=4 if nsp <= 32 else 8,
        )  # fmt: skip
    return o


def resident_slots(k_cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """Slot view ``[B·Hkv·NB, block, d]`` of a GPU-resident cache ``[B, Hkv, NB·block, d]`` (contiguous), no copy."""
    check_tensor("k_cache", k_cache, 4, "[B, Hkv, T, d]")
    B, H, T, D = k_cache.shape
    if T % block_size or not k_cache.is_contiguous():
        raise ValueError(f"k_cache must be contiguous with T a multiple of {block_size}, got {shape_str(k_cache)}")
    return k_cache.view(B * H * (T // block_size), block_size, D)


def resident_block_table(
    block_ids: torch.Tensor, blocks_per_row: int, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Slots of ``block_ids [B, Hkv, S]`` in a :func:`resident_slots` view (−1 stays −1), no host sync.

    ``rows [B]`` (integer): the row of the resident cache (its first dim) that batch row ``b`` reads, e.g. the cache
    slot of each sequence of a decode step; default ``b``.
    """
    B, H, _ = block_ids.shape
    if rows is None:
        rows = torch.arange(B, device=block_ids.device)
    else:
        check_tensor("rows", rows, 1, "[B]", floating=False)
        if rows.shape != (B,):
            raise ValueError(f"rows must be [B] = [{B}], got {shape_str(rows)}")
    heads = torch.arange(H, device=block_ids.device)
    base = ((rows.to(block_ids.device, torch.int64)[:, None] * H + heads[None, :]) * blocks_per_row).view(B, H, 1)
    return torch.where(block_ids >= 0, base + block_ids, -1).to(torch.int32)
