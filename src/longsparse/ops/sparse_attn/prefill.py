"""Block-sparse prefill attention, and the SparDA / InfLLM-V2 prefill entry points with their dense fallback.

* :func:`block_sparse_attention` — attention of ``q [B, T, Hq, d]`` over ``k, v [B, T, Hkv, d]`` restricted to each
  query token's block list (per KV head, GQA); returns exactly what dense attention with the same block mask
  returns (``naive.sparse_attention_ref``). Kernel: ``kernels/prefill.py``; where it does not run, dense SDPA under
  the block mask (``masked.py``).
* :func:`sparse_prefill` — one attention layer's prefill: dense causal attention (torch SDPA, its flash backend on a
  GPU) below ``config.dense_len`` tokens; otherwise compressed keys, block selection (InfLLM-V2 from ``q``, or
  Forecast from a given ``f``) and block-sparse attention.

The kernels take equal-length batches; packed ``cu_seqlens`` input is split on the host (one read of
``cu_seqlens``) and each sequence runs on its own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._launch import fast
from .checks import check_cu_seqlens, check_gqa, check_same_device, check_tensor, shape_str, use_kernels
from .compress import compress_keys
from .config import SelectKernelConfig, SparseAttentionConfig
from .launch import last_dim_contiguous, load_kernels, next_pow2
from .masked import masked_prefill
from .select import BlockSelection, TilePlan, build_tile_plan, default_tile_tokens, forecast_select, infllmv2_select

LOG2E = 1.4426950408889634


def _check_qkv(q, k, v):
    check_tensor("q", q, 4, "[B, T, Hq, d]")
    check_tensor("k", k, 4, "[B, T, Hkv, d]")
    check_tensor("v", v, 4, "[B, T, Hkv, d]")
    check_same_device(q=q, k=k, v=v)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, T, Hkv, d], got k {shape_str(k)} and v {shape_str(v)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q [B, T, Hq, d] and k [B, T, Hkv, d] must agree in B, T and d, got q {shape_str(q)} and k {shape_str(k)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return check_gqa(q.shape[2], k.shape[2])


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    selection: BlockSelection | torch.Tensor,
    block_size: int,
    *,
    scale: float | None = None,
    use_kernel: bool | None = None,
) -> torch.Tensor:
    """Causal attention of each query token over its selected KV blocks.

    ``selection``: a :class:`BlockSelection` from a selector (its plan is used as is) or block lists
    ``[B, T, Hkv, S]`` (int, −1 padded; a plan is built with :func:`build_tile_plan`). Returns ``[B, T, Hq, d]`` in
    ``q``'s dtype; a query that attends no key (an empty list) gets zeros.
    """
    G = _check_qkv(q, k, v)
    if not isinstance(block_size, int) or block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size!r}")
    block_idx = selection.block_idx if isinstance(selection, BlockSelection) else selection
    plan = selection.plan if isinstance(selection, BlockSelection) else None
    check_tensor("block_idx", block_idx, 4, "[B, T, Hkv, S]", floating=False)
    B, T, Hkv = k.shape[:3]
    if block_idx.shape[:3] != (B, T, Hkv):
        raise ValueError(f"block lists must be [B, T, Hkv, S] = [{B}, {T}, {Hkv}, S], got {shape_str(block_idx)}")
    check_same_device(q=q, block_idx=block_idx)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if not use_kernels(q.device, q.dtype, use_kernel):
        return masked_prefill(q, k, v, block_idx, block_size, scale)
    nb = -(-T // block_size)
    if plan is None or block_size % plan.tile_tokens or plan.tile_tokens * next_pow2(G) < 16:
        # tl.dot needs at least 16 (token, head) rows per tile
        plan = build_tile_plan(block_idx, default_tile_tokens(G), nb)
    if plan.counts.shape != (B, Hkv, -(-T // plan.tile_tokens)):
        raise ValueError(f"the selection's plan has counts {shape_str(plan.counts)}, not [B, Hkv, ceil(T / tile)]")
    return _attention_launch(q, k, v, plan, block_size, G, scale)


def _attention_launch(q, k, v, plan: TilePlan, block_size: int, G: int, scale: float) -> torch.Tensor:
    q, k, v = (last_dim_contiguous(x) for x in (q, k, v))
    B, T, Hq, D = q.shape
    Hkv = k.shape[2]
    o = torch.empty_like(q)
    BT = plan.tile_tokens
    if B * T * Hkv == 0:
        return o
    blocks, bits, counts = plan.blocks, plan.token_bits, plan.counts
    rows, width = BT * next_pow2(G), next_pow2(D)  # the program's accumulator tile
    fast(load_kernels("prefill").prefill_fwd_kernel_attn)[(-(-T // BT), B * Hkv)](
        q, k, v, o, blocks, bits, counts, T,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        blocks.stride(0), blocks.stride(1), blocks.stride(2),
        counts.stride(0), counts.stride(1),
        scale * LOG2E,
        HKV=Hkv, G=G, GP=next_pow2(G), D=D, BD=width, BT=BT, BLOCK=block_size, BM=rows,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=prefill_num_warps(rows, width), num_stages=prefill_num_stages(rows, width),
    )  # fmt: skip
    return o


def prefill_num_warps(rows: int, width: int) -> int:
    """Warps of a block-sparse prefill program holding a ``[rows, width]`` float32 accumulator: 4 up to 64 × 128
    (MiniCPM4's tiles), else 8. Compiled for sm_90 (``scripts/compile_check_attn.py``), Qwen3.5's 64 × 256 tile at 4
    warps needs every one of 255 registers plus stack; at 8 warps it takes 187 and none."""
    return 4 if rows * width <= 64 * 128 else 8


def prefill_num_stages(rows: int, width: int) -> int:
    """Pipeline depth of the block-sparse prefill loop: 3 for tiles up to 64 × 128 (MiniCPM4's: 41.6 against 46.1 ms
    at 2 on the H200, 128K tokens, B = 1), else 2 (Qwen3.5's 64 × 256 tile already takes 160 KiB of shared memory
    at 2)."""
    return 3 if rows * width <= 64 * 128 else 2


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None):
    """Dense causal GQA attention through torch SDPA: ``[B, T, Hq, d]``. The heads go in as contiguous heads-first
    copies, as for the models' dense attention (``models.attention.causal_sdpa`` says why)."""
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True)
    return o.transpose(1, 2)


def sparse_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    f: torch.Tensor | None = None,
    k_cmp: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    use_kernel: bool | None = None,
    kernel_config: SelectKernelConfig | None = None,
) -> torch.Tensor:
    """One attention layer's prefill with InfLLM-V2 (``f`` None) or Forecast (``f [B, T, Hkv, d]``) selection.

    Sequences shorter than ``config.dense_len`` get dense causal attention. ``k_cmp`` (this layer's compressed
    keys, e.g. already computed for the cache) is computed from ``k`` when omitted. ``kernel_config``: how the
    selection's kernels run (:class:`SelectKernelConfig`; default: its defaults). Returns ``[B, T, Hq, d]``.
    """
    G = _check_qkv(q, k, v)
    if not isinstance(config, SparseAttentionConfig):
        raise ValueError(f"config must be a SparseAttentionConfig, got {type(config).__name__}")
    if f is not None:
        check_tensor("f", f, 4, "[B, T, Hkv, d]")
        if f.shape != k.shape:
            raise ValueError(f"f must be [B, T, Hkv, d] like k {shape_str(k)}, got {shape_str(f)}")
    offsets = check_cu_seqlens(cu_seqlens, q.shape[0], q.shape[1])
    if offsets is not None:
        if k_cmp is not None:
            raise ValueError("pass k_cmp per sequence: with cu_seqlens it is computed here")
        parts = []
        for s, e in zip(offsets, offsets[1:]):
            fs = None if f is None else f[:, s:e]
            parts.append(
                sparse_prefill(
                    q[:, s:e],
                    k[:, s:e],
                    v[:, s:e],
                    config,
                    f=fs,
                    scale=scale,
                    use_kernel=use_kernel,
                    kernel_config=kernel_config,
                )  # fmt: skip
            )
        return torch.cat(parts, dim=1)
    T = q.shape[1]
    if T < config.dense_len:
        return dense_causal_attention(q, k, v, scale)
    if k_cmp is None:
        k_cmp, _ = compress_keys(k, config.kernel_size, config.kernel_stride, use_kernel=use_kernel)
    tile = default_tile_tokens(G)
    if f is None:
        selection = infllmv2_select(
            q, k_cmp, config, scale=scale, tile_tokens=tile, use_kernel=use_kernel, kernel_config=kernel_config
        )
    else:
        selection = forecast_select(
            f, k_cmp, config, tile_tokens=tile, use_kernel=use_kernel, kernel_config=kernel_config
        )
    return block_sparse_attention(q, k, v, selection, config.block_size, scale=scale, use_kernel=use_kernel)


def prefill_flops(block_idx: torch.Tensor, Hq_per_kv: int, d: int, block_size: int) -> float:
    """Useful FLOPs of block-sparse prefill (QKᵀ and PV over the attended keys, causal): a roofline reference."""
    B, T, Hkv, _ = block_idx.shape
    pos = torch.arange(T, device=block_idx.device)[None, :, None, None]
    valid = block_idx >= 0
    keys = torch.where(valid, torch.clamp(pos - block_idx.long() * block_size + 1, 0, block_size), 0)
    return float(keys.sum()) * Hq_per_kv * d * 4.0


def dense_prefill_flops(B: int, T: int, Hq: int, d: int) -> float:
    """FLOPs of dense causal attention (QKᵀ and PV over ``T(T+1)/2`` key positions per head)."""
    return 4.0 * B * Hq * d * T * (T + 1) / 2
