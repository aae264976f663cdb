"""Block selectors: InfLLM-V2 (the "Sparse" baseline) and SparDA's Forecast, for prefill and decode.

Semantics are those of ``naive.py`` (compressed-key causality, pooling, forced blocks, budget, tie-breaking); this
module validates inputs and launches the kernels of ``kernels/select.py``.

Prefill returns a :class:`BlockSelection`: the per-token block lists ``[B, T, Hkv, budget]`` and, for the attention
kernel, a :class:`TilePlan` — the union of the lists of each tile of ``tile_tokens`` consecutive tokens with a bit
mask saying which of the tile's tokens selected each block. The attention kernel computes a tile's ``tile_tokens·G``
(token, head) rows against every block of the union and masks each row to its own token's blocks, so it returns
exactly the per-token attention while reading each block once per tile instead of once per token.

Cost of the prefill selectors (per batch row and KV head, ``N ≈ T/16`` compressed keys, ``NB = T/64`` blocks, causal
halves everything): InfLLM-V2 does ``2·G`` row-by-key products of length ``d`` per (token, key) (a log-sum-exp
sweep and a scoring sweep; ``4·G·d·T·N/2`` FLOPs and ``2·G·T·N/2`` exponentials); Forecast does one product per
(token, key), no exponentials — ``2·G`` times fewer FLOPs. Both write the candidate block scores (float32, about
``T·NB/2`` entries: 1 GiB at T = 128K, B = 1, two KV heads) once and the top-k kernel reads them once; the
launcher processes the sequence in token chunks so that this scratch stays under ``scratch_bytes``. The top-k keeps
a row in registers (``next_pow2(NB)`` int32 keys) and searches its threshold four ways a pass
(:attr:`SelectKernelConfig.topk_arity`), one counting pass per step and about half of the 16 steps on scores
without ties at the boundary. In decode its dependent passes, not its reads, set its latency: 7.5 µs of a Forecast
decode selection's ~17 at 128K tokens on the H200 with the binary search (scores 3.2). A radix
select (4 or 8 bits a digit: 8 or 4 histogram passes in place of the count passes), bit-equal to it, measured slower
on the H200 in decode and prefill alike (docs/kernel-log.md) and is not kept: Triton's histogram is a shared-memory
atomic pass, dearer than the count it replaces. :attr:`SelectKernelConfig.topk_bitonic` selects a third form, a
bitonic top-k of 64-bit (score, block) keys, whose steps do not depend on the data (tested, not yet timed on the GPU;
off by default).

Decode runs 3 launches for InfLLM-V2 (log-sum-exp partials per chunk of 32 blocks, scores, top-k) and 2 for
Forecast (scores, top-k) — one fewer each with :attr:`SelectKernelConfig.decode_fused_topk`, where the scoring
kernel's last program of each row runs the top-k; both read every candidate compressed key once (InfLLM-V2 twice), so
at decode sizes the two differ mostly by one launch and one sweep — they are memory- and latency-bound, not
FLOP-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._launch import fast
from .checks import check_gqa, check_same_device, check_tensor, shape_str, use_kernels
from .config import MINICPM4, SelectKernelConfig, SparseAttentionConfig
from .launch import last_dim_contiguous, load_kernels, next_pow2
from .naive import (
    block_mass_ref,
    forecast_select_decode_ref,
    forecast_select_ref,
    infllmv2_select_decode_ref,
    infllmv2_select_ref,
    oracle_select_decode_ref,
    select_blocks_ref,
)

LOG2E = 1.4426950408889634
DEFAULT_SCRATCH_BYTES = 1 << 30


def topk_warps(nbp: int) -> int:
    """Warps of a top-k program over rows of ``nbp`` (a power of two) blocks: ~512 blocks a warp, 1 to 8. On the
    H200 at 128K tokens (2,048 blocks) 4 warps were the fastest of 1, 2, 4, 8, 16 both in prefill (8.4 ms per
    Forecast selection, 9.1 on 2 warps, 15.3 on 1) and in decode (7.5 µs per top-k at B = 1)."""
    return max(1, min(8, nbp // 512))


@dataclass(frozen=True)
class TilePlan:
    """Union of the block lists of each tile of ``tile_tokens`` consecutive tokens, per batch row and KV head.

    ``blocks [B, Hkv, NT, U]`` int32 ascending, −1 padded (``NT = ceil(T / tile_tokens)``, ``U`` the widest
    possible union); ``token_bits [B, Hkv, NT, U]`` int32, bit ``t`` set iff token ``t`` of the tile selected the
    block; ``counts [B, Hkv, NT]`` int32 union sizes. Tiles never straddle a KV block (``tile_tokens`` divides it).
    """

    tile_tokens: int
    blocks: torch.Tensor
    token_bits: torch.Tensor
    counts: torch.Tensor


@dataclass(frozen=True)
class BlockSelection:
    """Prefill selection: ``block_idx [B, T, Hkv, S]`` (int32, ascending, −1 padded) and its tile plan (or None)."""

    block_idx: torch.Tensor
    plan: TilePlan | None = None


def default_tile_tokens(group_size: int) -> int:
    """Tokens per attention tile: enough (token, head) rows for a 64-row MMA (4 for MiniCPM's G = 16); a group size
    that is not a power of two is padded to one (G = 3 -> 4 rows per token)."""
    return max(1, min(16, 64 // next_pow2(max(group_size, 1))))


def _check_kernel_config(kernel_config: SelectKernelConfig | None) -> SelectKernelConfig:
    if kernel_config is None:
        return SelectKernelConfig()
    if not isinstance(kernel_config, SelectKernelConfig):
        raise ValueError(f"kernel_config must be a SelectKernelConfig, got {type(kernel_config).__name__}")
    return kernel_config


def _check_tile_tokens(tile_tokens: int, config: SparseAttentionConfig) -> None:
    if not isinstance(tile_tokens, int) or tile_tokens <= 0 or tile_tokens & (tile_tokens - 1) or tile_tokens > 16:
        raise ValueError(f"tile_tokens must be a power of two in [1, 16], got {tile_tokens!r}")
    if config.block_size % tile_tokens:
        raise ValueError(f"tile_tokens={tile_tokens} must divide block_size={config.block_size}")


def build_tile_plan(block_idx: torch.Tensor, tile_tokens: int, num_blocks: int) -> TilePlan:
    """The :class:`TilePlan` of any block lists ``[B, T, Hkv, S]`` (torch ops, no host sync; memory ``~B·Hkv·T·NB``
    bytes — for tests and hand-made masks; the selectors emit the plan directly from their kernels)."""
    B, T, H, S = block_idx.shape
    NT = -(-T // tile_tokens)
    pad = NT * tile_tokens - T
    idx = block_idx.long()
    if pad:
        idx = torch.cat([idx, idx.new_full((B, pad, H, S), -1)], dim=1)
    idx = idx.view(B, NT, tile_tokens, H, S).permute(0, 3, 1, 2, 4)  # [B, H, NT, tile, S]
    hit = torch.zeros(B, H, NT, tile_tokens, num_blocks + 1, dtype=torch.int32, device=block_idx.device)
    hit.scatter_(-1, torch.where(idx < 0, num_blocks, idx.clamp_max(num_blocks)), 1)
    shifts = torch.arange(tile_tokens, device=block_idx.device, dtype=torch.int32)[:, None]
    bits = (hit[..., :num_blocks] << shifts).sum(dim=3, dtype=torch.int32)  # [B, H, NT, NB]
    blocks = torch.arange(num_blocks, device=block_idx.device)
    order = torch.sort(torch.where(bits != 0, blocks, num_blocks + blocks), dim=-1).values
    U = min(num_blocks, tile_tokens * S)
    order = order[..., :U]
    in_union = order < num_blocks
    plan_blocks = torch.where(in_union, order, -1).to(torch.int32)
    plan_bits = torch.where(in_union, bits.gather(-1, order.clamp_max(num_blocks - 1)), 0).to(torch.int32)
    counts = (bits != 0).sum(-1, dtype=torch.int32)
    return TilePlan(tile_tokens, plan_blocks.contiguous(), plan_bits.contiguous(), counts.contiguous())


def _check_prefill(x, name, layout, k_cmp, config, expect_heads=None):
    check_tensor(name, x, 4, layout)
    check_tensor("k_cmp", k_cmp, 4, "[B, N, Hkv, d]")
    check_same_device(**{name: x, "k_cmp": k_cmp})
    if not isinstance(config, SparseAttentionConfig):
        raise ValueError(f"config must be a SparseAttentionConfig, got {type(config).__name__}")
    B, T, H, d = x.shape
    if k_cmp.shape[0] != B or k_cmp.shape[3] != d:
        raise ValueError(
            f"k_cmp must be [B, N, Hkv, d] with B={B}, d={d} as in {name} {shape_str(x)}, got {shape_str(k_cmp)}"
        )
    if expect_heads is not None and H != expect_heads:
        raise ValueError(f"{name} must have one head per KV head ({expect_heads}), got {H} in {shape_str(x)}")
    need = config.num_compressed(T)
    if k_cmp.shape[1] < need:
        raise ValueError(
            f"k_cmp holds {k_cmp.shape[1]} compressed keys, fewer than the {need} of T={T} tokens "
            f"(kernel_size={config.kernel_size}, kernel_stride={config.kernel_stride})"
        )
    if k_cmp.dtype != x.dtype:
        raise ValueError(f"k_cmp dtype {k_cmp.dtype} must match {name} dtype {x.dtype}")


def infllmv2_select(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    scale: float | None = None,
    tile_tokens: int | None = None,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
    use_kernel: bool | None = None,
    kernel_config: SelectKernelConfig | None = None,
) -> BlockSelection:
    """InfLLM-V2 prefill selection of ``q [B, T, Hq, d]`` against this layer's ``k_cmp [B, N, Hkv, d]``.

    ``scale`` defaults to ``d^-0.5``; ``tile_tokens`` (default :func:`default_tile_tokens`) is the plan's tile.
    ``kernel_config``: how the kernels run (:class:`SelectKernelConfig`; default: its defaults).
    Returns per-token lists ``[B, T, Hkv, config.budget_blocks]`` and their tile plan.
    """
    _check_prefill(q, "q", "[B, T, Hq, d]", k_cmp, config)
    kernel_config = _check_kernel_config(kernel_config)
    G = check_gqa(q.shape[2], k_cmp.shape[2], "q", "k_cmp")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    tile_tokens = default_tile_tokens(G) if tile_tokens is None else tile_tokens
    _check_tile_tokens(tile_tokens, config)
    if not use_kernels(q.device, q.dtype, use_kernel):
        idx = infllmv2_select_ref(q, k_cmp, config, scale)
        return BlockSelection(idx, build_tile_plan(idx, tile_tokens, config.num_blocks(q.shape[1])))
    _check_kernel_rules(config, grouped=True)
    return _select_prefill(q, k_cmp, config, G, scale, tile_tokens, scratch_bytes, True, kernel_config)


def forecast_select(
    f: torch.Tensor,
    k_cmp: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    tile_tokens: int = 4,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
    use_kernel: bool | None = None,
    kernel_config: SelectKernelConfig | None = None,
) -> BlockSelection:
    """Forecast prefill selection: ``f [B, T, Hkv, d]`` (layer l−1's forecast) against layer l's ``k_cmp``.

    Layer 0 passes its own current-layer forecast with its own compressed keys. ``tile_tokens`` is the plan's
    tile; pass :func:`default_tile_tokens` of the attention layer's group size (4 for MiniCPM4). ``kernel_config``
    as for :func:`infllmv2_select`.
    """
    _check_prefill(f, "f", "[B, T, Hkv, d]", k_cmp, config, expect_heads=k_cmp.shape[2])
    kernel_config = _check_kernel_config(kernel_config)
    _check_tile_tokens(tile_tokens, config)
    if not use_kernels(f.device, f.dtype, use_kernel):
        idx = forecast_select_ref(f, k_cmp, config)
        return BlockSelection(idx, build_tile_plan(idx, tile_tokens, config.num_blocks(f.shape[1])))
    _check_kernel_rules(config, grouped=False)
    return _select_prefill(f, k_cmp, config, 1, 1.0, tile_tokens, scratch_bytes, False, kernel_config)


def _check_kernel_rules(config: SparseAttentionConfig, grouped: bool) -> None:
    """The Triton selectors implement InfLLM-V2's own rules only (``grouped``: a selector with G heads per group)."""
    rules = {"neighbour_blocks": config.neighbour_blocks}
    if grouped:
        rules["group_reduce"] = config.group_reduce
    odd = {k: v for k, v in rules.items() if v != getattr(MINICPM4, k)}
    if odd:
        raise ValueError(f"the Triton selectors do not implement {odd}: select with use_kernel=False")


def _dot_precision(dtype: torch.dtype) -> str:
    """float32 inputs get IEEE products (the references' precision); bf16/fp16 products are exact anyway."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _select_prefill(x, k_cmp, config, G, scale, tile_tokens, scratch_bytes, softmax, kernel_config):
    kernels = load_kernels("select")
    x, k_cmp = last_dim_contiguous(x), last_dim_contiguous(k_cmp)
    B, T, _, D = x.shape
    HKV, N = k_cmp.shape[2], k_cmp.shape[1]
    NB = config.num_blocks(T)
    S = config.budget_blocks
    NT = -(-T // tile_tokens)
    U = min(NB, tile_tokens * S)
    dev = x.device
    block_idx = torch.empty(B, T, HKV, S, dtype=torch.int32, device=dev)
    plan_blocks = torch.empty(B, HKV, NT, U, dtype=torch.int32, device=dev)
    plan_bits = torch.empty(B, HKV, NT, U, dtype=torch.int32, device=dev)
    counts = torch.empty(B, HKV, NT, dtype=torch.int32, device=dev)
    plan = TilePlan(tile_tokens, plan_blocks, plan_bits, counts)
    if B * HKV * T == 0:
        return BlockSelection(block_idx, plan)

    GP = next_pow2(G)
    bt_score = max(1, min(config.block_size, 128 // GP)) if softmax else config.block_size
    row_bytes = next_pow2(NB) * 4
    chunk = max(
        config.block_size, scratch_bytes // max(1, B * HKV * row_bytes) // config.block_size * config.block_size
    )
    chunk = min(chunk, -(-T // config.block_size) * config.block_size)
    scratch = torch.empty(B, HKV, chunk, next_pow2(NB), dtype=torch.float32, device=dev)
    BN = max(1, 64 // config.pool_stride)
    common = dict(BLOCK=config.block_size, INIT=config.init_blocks, LOCAL=config.local_blocks)
    for t_begin in range(0, T, chunk):
        rows = min(chunk, T - t_begin)
        fast(kernels.select_fwd_kernel_scores)[(-(-rows // bt_score), B * HKV)](
            x, k_cmp, scratch, T, N, t_begin,
            x.stride(0), x.stride(1), x.stride(2),
            k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2),
            scratch.stride(0), scratch.stride(1), scratch.stride(2),
            scale * LOG2E,
            HKV=HKV, G=G, GP=GP, D=D, BD=next_pow2(D), BT=bt_score, BN=BN,
            KS=config.kernel_size, ST=config.kernel_stride, P=config.pool_stride, R1=config.pool_overlap,
            SOFTMAX=softmax, DOT_PRECISION=_dot_precision(x.dtype), BM=bt_score * GP, BNC=BN * config.pool_stride,
            **common,
            num_warps=8 if bt_score * GP >= 128 else 4,
        )  # fmt: skip
        pieces = topk_row_pieces(t_begin, t_begin + rows, config.block_size, NB, kernel_config.min_topk_width)
        for p_begin, p_end, width in pieces:
            piece = scratch[:, :, p_begin - t_begin :]
            _launch_topk(kernels, piece, None, block_idx, plan, T, p_begin, p_end - p_begin, tile_tokens, config,
                         width, kernel_config, decode=False)  # fmt: skip
    return BlockSelection(block_idx, plan)


def topk_row_pieces(
    begin: int, end: int, block_size: int, num_blocks: int, min_width: int = SelectKernelConfig.min_topk_width
) -> list[tuple[int, int, int]]:
    """Token ranges ``[begin, end)`` cut where the top-k's row width changes: ``(piece begin, piece end, width)``.

    Token ``t`` can select blocks ``0 … t // block_size`` only, so its row is searched ``next_pow2(t // block_size
    + 1)`` blocks wide (at least ``min_width``, :attr:`SelectKernelConfig.min_topk_width`, at most
    ``next_pow2(num_blocks)``) rather than the whole
    sequence's width: the first half of a sequence costs half as much per token, the first quarter a quarter, …
    (a third less work over a whole causal prefill). Cuts fall on multiples of ``block_size``, so on tile bounds.
    """
    full = next_pow2(num_blocks)
    pieces = []
    t = begin
    while t < end:
        width = min(full, max(min_width, next_pow2(t // block_size + 1)))
        stop = end if width == full else min(end, width * block_size)  # the first token needing a wider row
        pieces.append((t, stop, width))
        t = stop
    return pieces


def _topk_consts(NBP: int, S: int, config: SparseAttentionConfig, kernel_config: SelectKernelConfig) -> dict:
    """The top-k row body's constexprs (``kernels/select._select_rows``) for rows ``NBP`` blocks wide and lists of
    ``S``, in ``kernel_config``'s form (``topk_arity``, ``topk_bitonic``), shared by the top-k kernel and the decode
    scoring kernel that fuses it."""
    budget = config.budget_blocks
    return dict(
        NBP=NBP, S=S, SP=next_pow2(S), BUDGET=budget, ARITY=kernel_config.topk_arity,
        BITONIC=kernel_config.topk_bitonic, KP=min(NBP, next_pow2(budget)),
    )  # fmt: skip


def _launch_topk(
    kernels, scratch, seqlens, block_idx, plan, T, t_begin, rows, tile_tokens, config, NBP, kernel_config, *, decode
):
    """Top-k over ``rows`` score rows from token ``t_begin`` (``scratch`` row 0), each searched ``NBP`` blocks wide."""
    B, HKV = scratch.shape[0], scratch.shape[1]
    S = block_idx.shape[-1]
    sub = 1 if decode else min(tile_tokens, kernel_config.topk_rows)  # a tile's rows go topk_rows at a time
    if decode:
        grid = (1, B * HKV)
        idx_strides = (block_idx.stride(0), 0, block_idx.stride(1))
        s_strides = (scratch.stride(0), scratch.stride(1), 0)
        plan_args = (block_idx, block_idx, block_idx, 0, 0, 0, 0, 0)
        U = 1
    else:
        grid = (-(-rows // tile_tokens), B * HKV)
        idx_strides = (block_idx.stride(0), block_idx.stride(1), block_idx.stride(2))
        s_strides = (scratch.stride(0), scratch.stride(1), scratch.stride(2))
        plan_args = (
            plan.blocks, plan.token_bits, plan.counts,
            plan.blocks.stride(0), plan.blocks.stride(1), plan.blocks.stride(2),
            plan.counts.stride(0), plan.counts.stride(1),
        )  # fmt: skip
        U = plan.blocks.shape[-1]
    fast(kernels.select_fwd_kernel_topk)[grid](
        scratch, seqlens if decode else scratch, block_idx, *plan_args[:3], T, t_begin,
        *s_strides, *idx_strides, *plan_args[3:],
        HKV=HKV, BT=1 if decode else tile_tokens, U=U, UP=next_pow2(U), BLOCK=config.block_size,
        INIT=config.init_blocks, LOCAL=config.local_blocks, DENSE_LEN=config.dense_len, DECODE=decode,
        WRITE_PLAN=not decode, SUB=sub, **_topk_consts(NBP, S, config, kernel_config),
        num_warps=min(16, kernel_config.topk_warps_scale * topk_warps(NBP)),
    )  # fmt: skip


def _check_decode(x, name, layout, k_cmp, seqlens, config, max_seqlen, expect_heads=None):
    check_tensor(name, x, 3, layout)
    check_tensor("k_cmp", k_cmp, 4, "[B, Ncap, Hkv, d]")
    check_tensor("seqlens", seqlens, 1, "[B]", floating=False)
    check_same_device(**{name: x, "k_cmp": k_cmp, "seqlens": seqlens})
    if not isinstance(config, SparseAttentionConfig):
        raise ValueError(f"config must be a SparseAttentionConfig, got {type(config).__name__}")
    B, H, d = x.shape
    if k_cmp.shape[0] != B or k_cmp.shape[3] != d:
        raise ValueError(
            f"k_cmp must be [B, Ncap, Hkv, d] with B={B}, d={d} as in {name} {shape_str(x)}, got {shape_str(k_cmp)}"
        )
    if seqlens.shape != (B,):
        raise ValueError(f"seqlens must be [B] = [{B}], got {shape_str(seqlens)}")
    if expect_heads is not None and H != expect_heads:
        raise ValueError(f"{name} must have one head per KV head ({expect_heads}), got {H} in {shape_str(x)}")
    if k_cmp.dtype != x.dtype:
        raise ValueError(f"k_cmp dtype {k_cmp.dtype} must match {name} dtype {x.dtype}")
    if max_seqlen is None:
        # The longest sequence whose visible compressed keys all fit in k_cmp.
        max_seqlen = (k_cmp.shape[1] - 1) * config.kernel_stride + config.kernel_size + config.kernel_stride - 1
    if not isinstance(max_seqlen, int) or max_seqlen <= 0:
        raise ValueError(f"max_seqlen must be a positive int bounding seqlens, got {max_seqlen!r}")
    return max_seqlen


def infllmv2_select_decode(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    seqlens: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    scale: float | None = None,
    max_seqlen: int | None = None,
    use_kernel: bool | None = None,
    topk_counters: torch.Tensor | None = None,
    kernel_config: SelectKernelConfig | None = None,
) -> torch.Tensor:
    """InfLLM-V2 decode selection for the new token of each sequence: ``[B, Hkv, config.decode_width()]``.

    ``q [B, Hq, d]`` is the token at position ``seqlens[b] − 1``; ``k_cmp [B, Ncap, Hkv, d]`` this layer's
    compressed keys (the incremental state, new token included); ``max_seqlen`` a host-side bound on ``seqlens``
    that sizes the launch (default: what ``k_cmp``'s capacity allows). No host sync. ``topk_counters``
    (:func:`decode_topk_counters`): the zeroed buffer a top-k fused into the scoring kernel counts in
    (:attr:`SelectKernelConfig.decode_fused_topk`; checked, and not read, otherwise), kept by the caller so that no
    call zeroes a new one. ``kernel_config``: how the kernels run (:class:`SelectKernelConfig`; default: its
    defaults).
    """
    max_seqlen = _check_decode(q, "q", "[B, Hq, d]", k_cmp, seqlens, config, max_seqlen)
    kernel_config = _check_kernel_config(kernel_config)
    G = check_gqa(q.shape[1], k_cmp.shape[2], "q", "k_cmp")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if not use_kernels(q.device, q.dtype, use_kernel):
        return infllmv2_select_decode_ref(q, k_cmp, seqlens, config, scale)
    _check_kernel_rules(config, grouped=True)
    return _select_decode(
        q, k_cmp, seqlens, config, G, scale, max_seqlen, kernel_config, softmax=True, counters=topk_counters
    )


def forecast_select_decode(
    f: torch.Tensor,
    k_cmp: torch.Tensor,
    seqlens: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    max_seqlen: int | None = None,
    use_kernel: bool | None = None,
    topk_counters: torch.Tensor | None = None,
    kernel_config: SelectKernelConfig | None = None,
) -> torch.Tensor:
    """Forecast decode selection: ``f [B, Hkv, d]`` of layer l against layer l+1's ``k_cmp`` -> ``[B, Hkv, W]``
    (arguments as for :func:`infllmv2_select_decode`).

    Layer l+1 has not seen the new token yet, so its newest compressed window may be missing; that window lies in
    the forced local window and is never read (only candidate blocks are scored).
    """
    max_seqlen = _check_decode(f, "f", "[B, Hkv, d]", k_cmp, seqlens, config, max_seqlen, k_cmp.shape[2])
    kernel_config = _check_kernel_config(kernel_config)
    if not use_kernels(f.device, f.dtype, use_kernel):
        return forecast_select_decode_ref(f, k_cmp, seqlens, config)
    _check_kernel_rules(config, grouped=False)
    return _select_decode(
        f, k_cmp, seqlens, config, 1, 1.0, max_seqlen, kernel_config, softmax=False, counters=topk_counters
    )


def decode_topk_counters(batch: int, kv_heads: int, device: torch.device | str) -> torch.Tensor:
    """The zeroed row counters ``[batch · kv_heads]`` (int32) of a decode selection with
    :attr:`SelectKernelConfig.decode_fused_topk`:
    pass them as ``topk_counters`` to every decode selection of at most ``batch`` sequences on ``device`` (each
    call leaves them zeroed, so one buffer serves every layer and step, CUDA-graph replays included)."""
    if batch < 0 or kv_heads < 0:
        raise ValueError(f"decode_topk_counters: batch and kv_heads must be >= 0, got {batch} and {kv_heads}")
    return torch.zeros(batch * kv_heads, dtype=torch.int32, device=device)


def _check_counters(counters: torch.Tensor, rows: int, device: torch.device) -> torch.Tensor:
    check_tensor("topk_counters", counters, 1, "[>= B·Hkv]", floating=False)
    if counters.dtype != torch.int32 or counters.device != device or counters.numel() < rows:
        raise ValueError(
            f"topk_counters must be int32 on {device} with at least B·Hkv = {rows} entries "
            f"(decode_topk_counters), got {counters.dtype} on {counters.device} with {counters.numel()}"
        )
    return counters


def _select_decode(x, k_cmp, seqlens, config, G, scale, max_seqlen, kernel_config, *, softmax, counters=None):
    kernels = load_kernels("select")
    x, k_cmp = last_dim_contiguous(x), last_dim_contiguous(k_cmp)
    B, _, D = x.shape
    HKV, N = k_cmp.shape[2], k_cmp.shape[1]
    NB = config.num_blocks(max_seqlen)
    W = config.decode_width()
    dev = x.device
    block_idx = torch.empty(B, HKV, W, dtype=torch.int32, device=dev)
    if B * HKV == 0:
        return block_idx
    BN = max(1, 64 // config.pool_stride)
    CB = BN * 2
    NCH = -(-NB // CB)
    GP = max(16, next_pow2(G))
    scratch = torch.empty(B, HKV, next_pow2(NB), dtype=torch.float32, device=dev)
    m_part = torch.empty(B * HKV, NCH, GP, dtype=torch.float32, device=dev)
    l_part = torch.empty_like(m_part)
    dims = dict(
        HKV=HKV,
        G=G,
        GP=GP,
        D=D,
        BD=next_pow2(D),
        CB=CB,
        BN=BN,
        KS=config.kernel_size,
        ST=config.kernel_stride,
        P=config.pool_stride,
        DOT_PRECISION=_dot_precision(x.dtype),
        BNC=BN * config.pool_stride,
    )
    strides = (x.stride(0), x.stride(1), k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2))
    if softmax:
        fast(kernels.select_fwd_kernel_decode_lse)[(B * HKV, NCH)](
            x, k_cmp, seqlens, m_part, l_part, *strides, scale * LOG2E, N, NCH, **dims, num_warps=4
        )
    if counters is not None:  # checked whether or not this build reads them: a wrong buffer is the caller's bug
        _check_counters(counters, B * HKV, dev)
    fused = kernel_config.decode_fused_topk
    if fused:
        if counters is None:
            counters = torch.zeros(B * HKV, dtype=torch.int32, device=dev)
        topk = dict(FUSE_TOPK=True, **_topk_consts(next_pow2(NB), W, config, kernel_config))
    else:
        counters, topk = block_idx, {}  # (a pointer the kernel does not read)
    fast(kernels.select_fwd_kernel_decode_scores)[(B * HKV, NCH)](
        x, k_cmp, seqlens, m_part, l_part, scratch, block_idx, counters, *strides, scratch.stride(0),
        scratch.stride(1), block_idx.stride(0), block_idx.stride(1), scale * LOG2E, N, NCH, BLOCK=config.block_size,
        R1=config.pool_overlap, INIT=config.init_blocks, LOCAL=config.local_blocks, DENSE_LEN=config.dense_len,
        SOFTMAX=softmax, **dims, **topk, num_warps=4,
    )  # fmt: skip
    if not fused:
        _launch_topk(
            kernels, scratch, seqlens, block_idx, None, 0, 0, 1, 1, config, next_pow2(NB), kernel_config, decode=True
        )
    return block_idx


def oracle_select(
    q: torch.Tensor,
    k: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    scale: float | None = None,
    tile_tokens: int | None = None,
    chunk: int = 256,
) -> BlockSelection:
    """Oracle prefill selection — a diagnostic, not a product mode: the budget's dynamic blocks are those of largest
    dense attention mass for the query group (``naive.block_mass_ref``), the best any selector can do with the same
    geometry and budget. ``q [B, T, Hq, d]``, ``k [B, T, Hkv, d]`` -> lists ``[B, T, Hkv, budget]`` and their tile
    plan. Torch on any device; the masses cost a dense attention, ``chunk`` query rows at a time."""
    check_tensor("q", q, 4, "[B, T, Hq, d]")
    check_tensor("k", k, 4, "[B, T, Hkv, d]")
    check_same_device(q=q, k=k)
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q [B, T, Hq, d] and k [B, T, Hkv, d] must agree in B, T and d, got {shape_str(q)} and "
                         f"{shape_str(k)}")  # fmt: skip
    G = check_gqa(q.shape[2], k.shape[2], "q", "k")
    B, T = q.shape[:2]
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    tile_tokens = default_tile_tokens(G) if tile_tokens is None else tile_tokens
    _check_tile_tokens(tile_tokens, config)
    positions = torch.arange(T, device=q.device).expand(B, T)
    scores = torch.cat(
        [
            block_mass_ref(q[:, s : s + chunk], k, positions[:, s : s + chunk], config.block_size, scale)
            for s in range(0, T, chunk)
        ],
        dim=2,
    )
    idx = select_blocks_ref(scores, positions, config)
    return BlockSelection(idx, build_tile_plan(idx, tile_tokens, config.num_blocks(T)))


def oracle_select_decode(
    q: torch.Tensor, k: torch.Tensor, seqlens: torch.Tensor, config: SparseAttentionConfig, *, scale=None
) -> torch.Tensor:
    """Oracle decode selection (a diagnostic): ``q [B, Hq, d]`` of the token at ``seqlens − 1`` over the cached keys
    ``k [B, L, Hkv, d]`` -> ``[B, Hkv, config.decode_width()]``. Torch on any device."""
    check_tensor("q", q, 3, "[B, Hq, d]")
    check_tensor("k", k, 4, "[B, L, Hkv, d]")
    check_tensor("seqlens", seqlens, 1, "[B]", floating=False)
    check_same_device(q=q, k=k, seqlens=seqlens)
    check_gqa(q.shape[1], k.shape[2], "q", "k")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[2] or seqlens.shape != (q.shape[0],):
        raise ValueError(f"k must be [B, L, Hkv, d] and seqlens [B] for q {shape_str(q)}, got {shape_str(k)} and "
                         f"{shape_str(seqlens)}")  # fmt: skip
    if int(seqlens.max()) > k.shape[1]:
        raise ValueError(f"seqlens reach {int(seqlens.max())}, past the {k.shape[1]} cached keys")
    return oracle_select_decode_ref(q, k, seqlens, config, scale)
