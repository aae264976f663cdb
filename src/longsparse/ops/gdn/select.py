"""SparseGDN event selection on the GPU, host side: :func:`select_events_gpu` sizes and launches the kernels of
``kernels/select.py`` (whose docstring has the algorithm), with the tier tables and chunk indices they read and the
choice between the three-launch and the one-launch forms."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .._launch import fast
from ..sparse_attn.launch import next_pow2  # plain Python: triton.next_power_of_2 costs ~5 µs of host time per call
from .config import SparseGDNConfig
from .heads import HeadSplit
from .kernels.select import (
    sparse_gdn_select_kernel_head_stats,
    sparse_gdn_select_kernel_mask,
    sparse_gdn_select_kernel_pair_rank,
    sparse_gdn_select_kernel_short,
)
from .layout import ChunkLayout
from .selection import Selection, fixed_tier_counts, tier_sizes, tier_table

MAX_SORT_CHUNKS = 8192
SHORT_CHUNKS = 128
"""The longest sequence, in chunks (8K tokens), the one-launch selector (:func:`sparse_gdn_select_kernel_short`)
takes."""
MODES = {"adaptive": 0, "random": 1, "all": 2, "fixed_tiers": 3}


@dataclass(frozen=True)
class SelectorBlocks:
    """How the selector's kernels split their work (``select_events_gpu(blocks=)``; any values make the same
    decisions): ``stats`` chunks per ``head_stats`` program; ``sort_max``: the longest sequence, in chunks (of the
    batch's longest, rounded up to a power of two), whose tier thresholds ``pair_rank`` finds by one sort — longer
    ones by bisection (``kernels.select._tier_thresholds``); ``rank_warps``: warps of each ``pair_rank`` program;
    ``short_warps``: the one-launch kernel's. Powers of two.

    Why these defaults (device µs of ``pair_rank`` on the H200): the sort 6 at 512 chunks and 53 at 2,048; the
    bisection 12 and 25–29 — a chain of 31 block-wide counts, ~20–30 µs at any length. ``stats`` 128 to 512 within
    1–2 µs of each other; 8 or 16 warps no faster."""

    stats: int = 256
    sort_max: int = 1024
    rank_warps: int = 4
    short_warps: int = 4

    def __post_init__(self):
        for name in ("stats", "sort_max", "rank_warps", "short_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"SelectorBlocks.{name} must be a power of two, got {value!r}")


AUTO_SHORT_CHUNKS = 64
"""The longest single sequence, in chunks (4K tokens), for which ``select_kernel="auto"`` takes one launch."""


def auto_takes_one_launch(layout: ChunkLayout) -> bool:
    """``select_kernel="auto"``: the one-launch selector for a single sequence of at most :data:`AUTO_SHORT_CHUNKS`
    chunks, the three launches (whose programs spread over the GPU) otherwise. The one launch saves two launches of
    host time (~15–40 µs by the host's load) but runs in one program: on the H200 23 / 30–50 / 58–101 µs of device
    time at 2K / 4K / 8K tokens against ~10 / 11 / 11–15 for the three launches. Up to 4K the host's time sets the
    call's and one launch wins; at 8K the device's can (the op side by side: 8K 0.42 ms with one launch, 0.33–0.36
    with three; 4K 0.25–0.28 against 0.31–0.35; on a host loaded to 0.6 ms per call one launch won at 8K too, 0.70
    against 0.84). Several sequences take the three launches (2 × 4K, 4 × 4K, 8 × 8K 0.89 / 0.92 / 0.95× with one
    launch, its one program per sequence doing serially what the three spread out; docs/kernel-log.md)."""
    return layout.N == 1 and layout.Cmax <= AUTO_SHORT_CHUNKS


def supports(layout: ChunkLayout) -> str | None:
    """None if the GPU selector covers this layout, else why not."""
    if layout.Cmax > MAX_SORT_CHUNKS:
        return f"a sequence of {layout.Cmax} chunks exceeds the selector's one-tile ranking ({MAX_SORT_CHUNKS} chunks)"
    return None


@functools.lru_cache(maxsize=32)
def _table_host(pairs: int, ratios: tuple[float, float, float]) -> tuple[tuple[int, ...], ...]:
    """The tier table as rows (n_H, n_M candidates..., -1 padding)."""
    table = tier_table(pairs, ratios)
    width = max(len(m) for m in table.values())
    return tuple((h, *m, *([-1] * (width - len(m)))) for h, m in table.items())


def tier_k_tensor(layout: ChunkLayout, ratios: tuple[float, float, float]) -> torch.Tensor:
    """``[N, 3]`` int32 on the layout's device: k_ℓ (low, mid, high) of every sequence (:func:`tier_sizes`, computed
    where the chunk counts are: nothing read back to the host)."""
    return tier_sizes(layout.chunks_per_seq, tuple(ratios)).to(torch.int32)


def tier_table_tensor(pairs: int, ratios: tuple[float, float, float], device) -> torch.Tensor:
    """The tier table rows of :func:`_table_host` as an int32 tensor on ``device`` (what the mask kernel reads)."""
    return torch.tensor(_table_host(pairs, tuple(ratios)), dtype=torch.int32, device=device)


@dataclass(frozen=True)
class ChunkIndex:
    """The layout's per-sequence and per-chunk indices as the kernels read them, int32 on the device:
    ``seq_chunk0``, ``seq_nchunks`` ``[N]`` (first chunk, chunk count) and ``chunk_bos``, ``chunk_len`` ``[NC]`` (first
    token, valid tokens). Built once per launch plan: four conversions fewer per call."""

    seq_chunk0: torch.Tensor
    seq_nchunks: torch.Tensor
    chunk_bos: torch.Tensor
    chunk_len: torch.Tensor

    @classmethod
    def of(cls, layout: ChunkLayout) -> ChunkIndex:
        return cls(
            layout.seq_chunk_offsets[:-1].int(),
            layout.chunks_per_seq.int(),
            layout.token_index[:, 0].int(),
            layout.chunk_len.int(),
        )


def select_events_gpu(
    layout: ChunkLayout,
    score: torch.Tensor,
    gamma: torch.Tensor,
    group: int,
    config: SparseGDNConfig,
    gate: torch.Tensor | None = None,
    gate_norm_weight: torch.Tensor | None = None,
    *,
    tier_k: torch.Tensor | None = None,
    table: torch.Tensor | None = None,
    index: ChunkIndex | None = None,
    details: bool = True,
    decay_prefix: torch.Tensor | None = None,
    short: bool | None = False,
    blocks: SelectorBlocks = SelectorBlocks(),
    head_split: HeadSplit | None = None,
) -> Selection:
    """The specification's :func:`~longsparse.ops.gdn.spec.select.select_events` on the GPU.

    score, gamma: ``[NC, HV]`` float32 (intra.py's layout). The returned Selection carries mask, tier, tier_k,
    n_high, n_mid and the normalised gains; rank scores, lifetimes and visibilities are left as None (the statistics
    do not need them). ``tier_k`` (:func:`tier_k_tensor`), ``table`` (:func:`tier_table_tensor`) and ``index``
    (:class:`ChunkIndex`): as kept by the caller's launch plan (default: built here). ``details=False`` returns the
    mask alone (every other field None): what the main pass reads; with details one conversion (the tier sizes to
    int64) follows the kernels — the mask kernel writes tiers, tier counts and normalised gains as the specification
    holds them. ``decay_prefix``: a ``[NC, HV]`` float64 buffer that the first kernel fills with the sequence-local
    exclusive prefix of ``gamma`` (what :func:`~longsparse.ops.gdn.launch.decay_prefix` computes), since it reads
    every chunk decay of every sequence anyway. ``short``: True — the one-launch selector
    (:func:`sparse_gdn_select_kernel_short`; refused where a sequence has more than :data:`SHORT_CHUNKS` chunks);
    None — it where :func:`auto_takes_one_launch` (one sequence of at most :data:`SHORT_CHUNKS` chunks); False — the
    three launches (``SparseGDNKernelConfig.select_kernel`` "one", "auto", "three"). The same decisions either way.
    ``blocks``: how the three launches split their work (:class:`SelectorBlocks`; the tests take small blocks to
    spread short sequences over several programs).
    ``head_split``: ``score``, ``gamma`` and ``gate`` hold these heads of the layer (tensor parallelism): the first
    launch sums their statistics, which are gathered with their scores from the other heads' calls, and the other two
    launches choose every pair's events (three launches, not the one-launch form); ``table`` is the layer's.
    """
    dev = score.device
    NC, HV = score.shape
    held = HV  # the heads of the statistics launch
    if head_split is not None:
        if short:
            raise ValueError("select_events_gpu: a head split takes the three launches (short=False)")
        HV = head_split.total
    P = HV // group
    N, Cmax = layout.N, max(layout.Cmax, 1)
    CP = next_pow2(Cmax)
    if tier_k is None:
        tier_k = tier_k_tensor(layout, config.tier_ratios)
    index = index or ChunkIndex.of(layout)
    seq_chunk0, seq_nchunks = index.seq_chunk0, index.seq_nchunks
    chunk_bos, chunk_len = index.chunk_bos, index.chunk_len
    if short is None:
        short = auto_takes_one_launch(layout)
    elif short and Cmax > SHORT_CHUNKS:
        raise ValueError(
            f"select_events_gpu: short=True takes sequences of at most {SHORT_CHUNKS} chunks, the longest has {Cmax}"
        )
    use_gate = gate is not None and config.visibility
    f32 = dict(dtype=torch.float32, device=dev)
    V = gate.shape[-1] if use_gate else 1
    if gate_norm_weight is None and use_gate:
        gate_norm_weight = torch.ones(V, **f32)
    gate_flat = gate.reshape(-1, held, V).contiguous() if use_gate else score  # the kernels step by held · V
    rows = _table_host(P, tuple(config.tier_ratios))
    if table is None:
        table = tier_table_tensor(P, config.tier_ratios, dev)
    fixed = (
        fixed_tier_counts(config.fixed_tiers, P, config.tier_ratios) if config.selection == "fixed_tiers" else (0, 0)
    )
    mask = torch.empty(N, P, Cmax, dtype=torch.uint8, device=dev)
    if details:  # int64 as the specification's Selection holds them: the statistics need no conversion launches
        tier = torch.empty(N, P, dtype=torch.int64, device=dev)
        n_high = torch.empty(N, dtype=torch.int64, device=dev)
        n_mid = torch.empty(N, dtype=torch.int64, device=dev)
        x = torch.empty(N, P, 2, **f32)
    else:  # not written
        tier = n_high = n_mid = x = mask
    life = torch.empty(N, HV, **f32) if details or not short else None
    decisions = dict(
        P=P,
        PP=max(next_pow2(P), 2),
        NH=len(rows),
        NM=len(rows[0]) - 1,
        CP=CP,
        CMAX=Cmax,
        MODE=MODES[config.selection],
        FIXED_HIGH=fixed[0],
        FIXED_MID=fixed[1],
        DETAILS=details,
    )
    if short:
        fast(sparse_gdn_select_kernel_short)[(N,)](
            score,
            gamma,
            gate_flat,
            gate_norm_weight if use_gate else score,
            seq_chunk0,
            seq_nchunks,
            chunk_bos,
            chunk_len,
            tier_k,
            table,
            score if decay_prefix is None else decay_prefix,
            mask,
            tier,
            n_high,
            n_mid,
            x,
            mask if life is None else life,
            config.seed,
            HV=HV,
            HVP=next_pow2(HV),
            V=V,
            GS=group,
            WINDOW=config.lifetime_window,
            HAS_GATE=use_gate,
            HAS_PREFIX=decay_prefix is not None,
            BC=32,
            num_warps=blocks.short_warps,
            **decisions,
        )
        return _selection(mask, tier, tier_k, n_high, n_mid, x, life, config, seq_nchunks, details)
    stats_block = min(blocks.stats, CP)
    NB = CP // stats_block
    partial = torch.empty(N, held, NB, 4, **f32)
    fast(sparse_gdn_select_kernel_head_stats)[(N, held, NB)](
        score,
        gamma,
        gate_flat,
        gate_norm_weight if use_gate else score,
        seq_chunk0,
        seq_nchunks,
        chunk_bos,
        chunk_len,
        partial,
        score if decay_prefix is None else decay_prefix,
        HV=held,
        V=V,
        WINDOW=config.lifetime_window,
        HAS_GATE=use_gate,
        HAS_PREFIX=decay_prefix is not None,
        BC=stats_block,
        NB=NB,
    )
    if head_split is not None:
        partial, score = head_split.gather(partial, 1), head_split.gather(score, 1)
    keys = torch.empty(N, P, CP, dtype=torch.int64, device=dev)
    thresholds = torch.empty(N, P, 3, dtype=torch.int64, device=dev)
    gains = torch.empty(N, P, 2, **f32)
    fast(sparse_gdn_select_kernel_pair_rank)[(N, P)](
        score,
        seq_chunk0,
        seq_nchunks,
        tier_k,
        partial,
        life,
        keys,
        thresholds,
        gains,
        HV=HV,
        GS=group,
        GSP=max(next_pow2(group), 2),
        P=P,
        HVP=next_pow2(HV),
        CP=CP,
        NB=NB,
        BC=stats_block,
        WINDOW=config.lifetime_window,
        USE_VIS=use_gate,
        SORT=CP <= blocks.sort_max,
        num_warps=blocks.rank_warps,
    )
    fast(sparse_gdn_select_kernel_mask)[(N, P)](
        gains,
        table,
        keys,
        thresholds,
        tier_k,
        seq_nchunks,
        mask,
        tier,
        n_high,
        n_mid,
        x,
        config.seed,
        **decisions,
    )
    return _selection(mask, tier, tier_k, n_high, n_mid, x, life, config, seq_nchunks, details)


def _selection(mask, tier, tier_k, n_high, n_mid, x, life, config, seq_nchunks, details) -> Selection:
    """The kernels' outputs as the specification's :class:`Selection` (the mask alone without ``details``)."""
    if not details:
        fields = ("tier", "tier_k", "n_high", "n_mid", "rank_score", "lifetime", "visibility", "gain_mid", "gain_high")
        return Selection(mask=mask.view(torch.bool), **dict.fromkeys(fields))
    if config.selection == "all":
        tier_k = seq_nchunks[:, None].expand(-1, 3)
    return Selection(
        mask=mask.view(torch.bool),
        tier=tier,
        tier_k=tier_k.long(),
        n_high=n_high,
        n_mid=n_mid,
        rank_score=None,
        lifetime=life,
        visibility=None,
        gain_mid=x[..., 0],
        gain_high=x[..., 1],
    )
