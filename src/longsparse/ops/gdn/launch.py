"""Host side of the SparseGDN GPU path: plan the launches, run intra → selection → fused main pass.

Stages (each checked against the torch specification in tests; the kernels are in ``kernels/``):

1. ``intra.py``    per (chunk, value head): the kept blocks of ``C diag(β)``, the chunk decay γ, the tail score s.
2. selection       the specification's selector (``spec/select.py``) run on the device on those scores: pure tensor
                   code, no host synchronisation, so the event count never travels to the host.
3. main pass      ``kernel_config.main_pass``: ``"walk"`` — ``kernels/fused.py``, per (segment, value head, V tile):
                   U, the event-sparse recurrence and the grouped output in one walk over every chunk (on Hopper
                   from 16K tokens the same walk in Gluon, ``walk_gluon.py``: :func:`resolve_walk`); ``"csr"`` —
                   ``csr.py`` builds the event CSR on the device, ``kernels/recur.py`` visits only the selected chunks
                   (per segment, value head, V tile) storing U' and the state after each event,
                   ``kernels/output.py`` computes the output per (chunk pair, value head, V tile).

The only host work per call is the chunk/segment plan from the sequence lengths (known on the host for batch rows; one
copy of ``cu_seqlens`` for varlen, as FLA's varlen path does). It is a :class:`LaunchPlan`: built once, it serves every
call over the same sequences — a model's GDN layers in one forward pass share one (plan once, run per layer), so the
host work and its small host-to-device copies are paid once per pass instead of once per layer.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from dataclasses import dataclass, field

import torch

from .._launch import fast
from .._triton import kernels_can_run_on, triton_mode
from ..norm import l2_norm
from . import select as gpu_select
from . import walk_gluon
from .config import STORED_SCORES_MIN_CHUNKS, SparseGDNConfig, SparseGDNKernelConfig
from .csr import build_event_csr, event_capacity
from .heads import HeadSplit
from .intra import intra_forward
from .kernels.fused import sparse_gdn_fwd_kernel_entry, sparse_gdn_fwd_kernel_fused, sparse_gdn_fwd_kernel_scores
from .kernels.output import sparse_gdn_fwd_kernel_output
from .kernels.recur import sparse_gdn_fwd_kernel_recur
from .layout import ChunkLayout, build_layout
from .selection import Selection
from .spec.select import select_events
from .stats import SparseGDNStats

REGISTERS_PER_SM = 65536
"""Hopper's (and every recent NVIDIA SM's) register file, in 32-bit registers."""
BATCH_PLANS_KEPT = 16
"""Launch plans of equal-length batches kept for calls without a plan (:func:`batch_plan`); each holds a few small
int32/int64 index tensors on the device (``token_index``, ``[NC, 64]`` int64, is the largest: 16 MiB at 8 × 128K)."""
VARLEN_PLANS_KEPT = 16
"""Launch plans of packed sequences kept for calls without a plan (:func:`varlen_plan`), as many as
``BATCH_PLANS_KEPT`` and of the same size for the same tokens."""
MIN_SEGMENT_CHUNKS = 8
OUTPUT_NUM_STAGES = 3
"""Pipeline stages of the csr output kernel. Its bf16 builds at one stage (and at 8 warps) take exactly 49,152 B of
shared memory, the 48 KiB default dynamic limit, and every such build stopped with an illegal memory access on the
H200 (Triton 3.6, sm_90); three stages take 49,428 B and run exact (docs/gdn-kernels.md). The loop has one or two
trips, so the extra stages cost nothing; ``tests/ops/gdn/test_kernel_builds.py`` keeps every build off 48 KiB."""


@dataclass(frozen=True)
class SegmentPlan:
    """Segments of the main pass: ``seq``, ``c0``, ``c1`` ``[NS]`` int32 (sequence, first chunk, end chunk; even
    starts), plus per-sequence ``chunk0`` and ``nchunks`` ``[N]`` int32."""

    seq: torch.Tensor
    c0: torch.Tensor
    c1: torch.Tensor
    chunk0: torch.Tensor
    nchunks: torch.Tensor

    @property
    def count(self) -> int:
        return self.seq.numel()


def stores_scores(kernel_config: SparseGDNKernelConfig, chunks: int) -> bool:
    """Whether the walk over ``chunks`` chunks (all sequences of the call) reads stored scores
    (``SparseGDNKernelConfig.walk_scores``): ``"auto"`` stores them from ``STORED_SCORES_MIN_CHUNKS`` up, where the
    products the walk saves outweigh the extra kernel and its launch."""
    if kernel_config.walk_scores == "auto":
        return chunks >= STORED_SCORES_MIN_CHUNKS
    return kernel_config.walk_scores == "stored"


def resident_programs(num_warps: int) -> int:
    """Main-pass programs one SM holds at once: every walk and recurrence kernel takes 236-255 registers
    (``scripts/kernel_report.py``; the walk also 94-111 KB of shared memory), so 2 at 4 warps and 1 at 8."""
    return max(1, REGISTERS_PER_SM // (256 * 32 * num_warps))


WARMUP_STEPS = 10
"""Chunk steps a segment's warm-up walk is assumed to take when planning segments (the walk back to where the decay
reaches e^-12: ~9 chunks at the benchmark's retention of 0.98 per token; fewer with faster decay)."""


def _schedule(groups: dict[int, int], slots: int) -> int:
    """Steps until the last of ``groups`` (steps -> programs) ends on ``slots`` slots, longest programs first onto the
    slot that frees earliest (how the GPU's block scheduler fills freed slots). Slots sharing a free time are one
    heap entry, so the cost follows the number of distinct program lengths and waves, not the programs."""
    free = [(0, slots)]  # (free from, slots)
    end = 0
    for steps in sorted(groups, reverse=True):
        left = groups[steps]
        while left:
            t, n = heapq.heappop(free)
            while free and free[0][0] == t:  # merge slots freed at the same time
                n += heapq.heappop(free)[1]
            take = min(left, n)
            if n > take:
                heapq.heappush(free, (t, n - take))
            heapq.heappush(free, (t + steps, take))
            end = max(end, t + steps)
            left -= take
    return end


def walk_makespan(chunks: list[int], length: int, parallel_width: int, slots: int) -> int:
    """Estimated chunk steps of the main pass (entry warm-ups, then the walk) when every sequence of ``chunks`` is cut
    into segments of ``length`` chunks, each run by ``parallel_width`` programs on ``slots`` resident slots."""
    walk, warm = {}, 0
    for C in chunks:
        if C >= length:
            walk[length] = walk.get(length, 0) + parallel_width * (C // length)
        if C % length:
            walk[C % length] = walk.get(C % length, 0) + parallel_width
        warm += parallel_width * ((C - 1) // length)  # every segment but the first warms up
    return _schedule(walk, slots) + (_schedule({WARMUP_STEPS: warm}, slots) if warm else 0)


def segment_length(chunks: list[int], parallel_width: int, slots: int) -> int:
    """Chunks per segment (even, at least ``MIN_SEGMENT_CHUNKS``): of the lengths that cut the longest sequence into
    1 to ``slots // parallel_width + 2`` segments, the one whose :func:`walk_makespan` is the shortest (the longest on
    ties). Every program of a segment walks its chunks in sequence, so a last wave that is only partly full costs a
    whole program's time: at 128K with 64-wide tiles the earlier rule (about 4 programs per SM: 576 programs on 264
    slots, the third wave 18 % full) measured 6.07 ms against 5.12 for two full waves and 4.99 for one. With
    sequences of unequal lengths the short ones' programs fill the slots the long ones leave idle."""
    longest = max(chunks, default=0)
    if longest <= MIN_SEGMENT_CHUNKS:
        return MIN_SEGMENT_CHUNKS
    candidates = set()
    for split in range(1, max(1, slots // max(parallel_width, 1)) + 3):
        length = max(MIN_SEGMENT_CHUNKS, math.ceil(longest / split))
        candidates.add(length + (length % 2))
    return min(candidates, key=lambda L: (walk_makespan(chunks, L, parallel_width, slots), -L))


def plan_segments(
    lengths: list[int], parallel_width: int, slots: int, device, length: int | None = None
) -> SegmentPlan:
    """Cut every sequence into segments of ``length`` chunks (default :func:`segment_length`), longest first: the
    walk's kernels take their segment from the launch order (segment-major), and the GPU starts programs in that
    order as slots free up, so the longest start first — the schedule :func:`walk_makespan` assumes."""
    chunks = [-(-n // 64) for n in lengths]
    offsets = [0]
    for C in chunks:
        offsets.append(offsets[-1] + C)
    L = length or segment_length(chunks, parallel_width, slots)
    segments = [(n, start, min(C, start + L)) for n, C in enumerate(chunks) for start in range(0, C, L)]
    segments.sort(key=lambda s: s[1] - s[2])  # longest first (stable: sequence order among equals)
    seq, c0, c1 = (list(x) for x in zip(*segments)) if segments else ([], [], [])

    def t(x):
        return torch.tensor(x, dtype=torch.int32, device=device)

    return SegmentPlan(t(seq), t(c0), t(c1), t(offsets[:-1]), t(chunks))


@dataclass
class LaunchPlan:
    """What a SparseGDN call derives from its sequence lengths alone: ``lengths`` (host), the chunk ``layout``, its
    int32 ``index`` as the kernels read it (:class:`~longsparse.ops.gdn.select.ChunkIndex`), and — computed on first
    use and kept — the segment plans, the selector's tier sizes and its tier table. Build it with :func:`plan_launch`
    and pass it as ``plan=`` to every call over the same sequences (``B``, ``T`` and, for varlen, the same
    ``cu_seqlens``); a call checks the shapes it can see without a device sync (B, T, N, device)."""

    B: int
    T: int
    lengths: list[int]
    layout: ChunkLayout
    index: gpu_select.ChunkIndex
    cu_seqlens: torch.Tensor | None = field(default=None, repr=False)
    offsets: list[int] | None = None
    _kept: dict = field(default_factory=dict, repr=False)

    def offsets_of(self, cu_seqlens: torch.Tensor | None) -> list[int] | None:
        """The host copy of ``cu_seqlens`` this plan was built from, if ``cu_seqlens`` is that very tensor (a model's
        layers pass the step's one tensor), else None: the call then reads the tensor to check it."""
        return self.offsets if cu_seqlens is not None and cu_seqlens is self.cu_seqlens else None

    @property
    def chunk_bos(self) -> torch.Tensor:
        """``[NC]`` int32 first token of every chunk."""
        return self.index.chunk_bos

    @property
    def chunk_len(self) -> torch.Tensor:
        """``[NC]`` int32 valid tokens of every chunk."""
        return self.index.chunk_len

    @property
    def device(self) -> torch.device:
        return self.chunk_bos.device

    def check(self, B: int, T: int, cu_seqlens: torch.Tensor | None, device: torch.device) -> None:
        """Raise if this plan cannot be for a call of ``B`` rows of ``T`` tokens with ``cu_seqlens`` on ``device``."""
        N = B if cu_seqlens is None else cu_seqlens.numel() - 1
        if (self.B, self.T, len(self.lengths), self.device) != (B, T, N, device):
            raise ValueError(
                f"the launch plan is for B={self.B}, T={self.T}, {len(self.lengths)} sequences on {self.device}; "
                f"this call has B={B}, T={T}, {N} sequences on {device}"
            )

    def segments(self, parallel_width: int, slots: int, segment_chunks: int | None) -> SegmentPlan:
        key = ("segments", parallel_width, slots, segment_chunks)
        return self._keep(key, lambda: plan_segments(self.lengths, parallel_width, slots, self.device, segment_chunks))

    def tier_k(self, ratios: tuple[float, float, float]) -> torch.Tensor:
        """``[N, 3]`` int32 on the device: k_ℓ (low, mid, high) of every sequence."""
        return self._keep(("tier_k", tuple(ratios)), lambda: gpu_select.tier_k_tensor(self.layout, ratios))

    def tier_table(self, pairs: int, ratios: tuple[float, float, float]) -> torch.Tensor:
        """The selector's tier table rows ``[entries, 1 + candidates]`` int32 on the device."""
        key = ("table", pairs, tuple(ratios))
        return self._keep(key, lambda: gpu_select.tier_table_tensor(pairs, tuple(ratios), self.device))

    def _keep(self, key, build):
        if key not in self._kept:
            self._kept[key] = build()
        return self._kept[key]


def plan_launch(B: int, T: int, cu_seqlens: torch.Tensor | None, device: torch.device) -> LaunchPlan:
    """The :class:`LaunchPlan` of ``B`` rows of ``T`` tokens, or of the packed sequences of ``cu_seqlens`` (one copy of
    it to the host)."""
    return _plan_of(B, T, None if cu_seqlens is None else cu_seqlens.tolist(), device, cu_seqlens)


def _plan_of(B: int, T: int, host: list[int] | None, device: torch.device, cu_seqlens=None) -> LaunchPlan:
    """The plan of ``B`` rows of ``T`` tokens, or of the packed sequences at the offsets ``host`` (host ints)."""
    offsets = None if host is None else torch.tensor(host, dtype=torch.int64)
    lengths = [T] * B if offsets is None else (offsets[1:] - offsets[:-1]).tolist()
    layout = build_layout(B, T, offsets, device)
    return LaunchPlan(B, T, lengths, layout, gpu_select.ChunkIndex.of(layout), cu_seqlens, host)


@functools.lru_cache(maxsize=BATCH_PLANS_KEPT)
def batch_plan(B: int, T: int, device: torch.device) -> LaunchPlan:
    """The plan of ``B`` rows of ``T`` tokens, built once per ``(B, T, device)`` and shared by the calls that bring no
    plan of their own. Such a plan is a pure function of those three values (a plan only ever adds entries derived
    from them to its own cache), so sharing it is safe; building it costs a one-off call ~20 host-side tensor ops
    and ~10 small host-to-device copies, which at short lengths is most of the call. Varlen calls (``cu_seqlens``)
    are kept by their offsets' values (:func:`varlen_plan`)."""
    return plan_launch(B, T, None, device)


@functools.lru_cache(maxsize=VARLEN_PLANS_KEPT)
def varlen_plan(B: int, T: int, offsets: tuple[int, ...], device: torch.device) -> LaunchPlan:
    """The plan of the packed sequences at ``offsets`` (``cu_seqlens``'s values, host ints), built once per
    ``(B, T, offsets, device)`` like :func:`batch_plan`'s: a varlen plan is more host work than a batch-row one,
    and a call should not pay it again for offsets it has seen. It holds no caller's
    tensor (:func:`plan_for` hands out views bound to the call's ``cu_seqlens``). Nothing else enters it: what the
    config changes (segment plans, tier tables) the plan keeps per setting as it is asked for."""
    return _plan_of(B, T, list(offsets), device)


def plan_for(
    B: int, T: int, cu_seqlens: torch.Tensor | None, device: torch.device, offsets: list[int] | None = None
) -> LaunchPlan:
    """The plan a call without one uses: :func:`batch_plan`'s kept plan for batch rows; for varlen a view of
    :func:`varlen_plan`'s kept plan of the offsets' values (``offsets``: the host copy of ``cu_seqlens`` the caller
    already made; without it, one copy of the tensor to the host). The view shares the kept plan's layout, index and
    derived tables and carries ``cu_seqlens``, so that calls passing it with that same tensor check the host copy
    instead of reading the tensor again (:meth:`LaunchPlan.offsets_of`)."""
    if cu_seqlens is None:
        return batch_plan(B, T, device)
    host = tuple(offsets) if offsets is not None else tuple(cu_seqlens.tolist())
    return dataclasses.replace(varlen_plan(B, T, host, device), cu_seqlens=cu_seqlens)


def search_steps(max_chunks: int) -> int:
    """Binary-search iterations that cover ``max_chunks`` positions (the entry kernel's ``SEARCH_STEPS``)."""
    return max(1, math.ceil(math.log2(max_chunks + 1)))


def decay_prefix(gamma: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """``[NC, HV]`` float64 sequence-local exclusive prefix of the chunk decays, ``P_c = Σ_{j<c} γ_j`` (Eq. 19)."""
    g64 = gamma.double()
    excl = g64.cumsum(0) - g64
    return excl - excl[layout.seq_chunk_offsets[:-1][layout.chunk_seq]]


def supports(q: torch.Tensor, v: torch.Tensor, config: SparseGDNConfig) -> str | None:
    """None if the kernels cover this call, else the reason they do not."""
    K, V = q.shape[-1], v.shape[-1]
    if config.selection == "uniform_random":
        return "selection='uniform_random' (a diagnostic control) runs on the torch backend only"
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {q.dtype}: the kernels take bf16, fp16 or fp32"
    if not kernels_can_run_on(q.device):
        return f"Triton kernels cannot run on {q.device} here (mode: {triton_mode()})"
    if K not in (16, 32, 64, 128, 256) or V not in (16, 32, 64, 128, 256):
        return f"head dims K={K}, V={V} must be powers of two in [16, 256]"
    if config.solve != "block_adjacent":
        return "solve='full' (the exact-solve ablation) runs on the torch backend only"
    if config.tail != 16:
        return f"tail={config.tail}: the kernels compute the tail-16 score"
    return None


def sparse_gdn_triton_forward(
    q,
    k,
    v,
    g,
    beta,
    scale,
    initial_state,
    output_final_state,
    use_qk_l2norm_in_kernel,
    cu_seqlens,
    *,
    gate=None,
    gate_norm_weight=None,
    config: SparseGDNConfig,
    kernel_config: SparseGDNKernelConfig,
    return_stats=False,
    plan: LaunchPlan | None = None,
    bounded_inputs: bool = False,
    head_split: HeadSplit | None = None,
):
    """The GPU path of :func:`longsparse.ops.gdn.sparse_chunk_gated_delta_rule` (inputs already validated)."""
    reason = supports(q, v, config)
    if reason:
        raise ValueError(f"SparseGDN backend='triton' cannot run this call: {reason}")
    if use_qk_l2norm_in_kernel:  # one pass each (ops.norm), not a float32 copy and four more passes
        q, k = l2_norm(q), l2_norm(k)
    o, final, selection, layout = run_kernels(
        q, k, v, g, beta, scale, initial_state, cu_seqlens, gate=gate, gate_norm_weight=gate_norm_weight, config=config,
        kernel_config=kernel_config, plan=plan, details=return_stats, bounded_inputs=bounded_inputs,
        head_split=head_split,
    )  # fmt: skip
    final = final if output_final_state else None
    if return_stats:
        stats = SparseGDNStats.from_selection(selection, layout)
        if kernel_config.main_pass == "csr":  # it stores the state after every event
            stats = dataclasses.replace(stats, num_snapshots=stats.num_events)
        return o, final, stats
    return o, final


def run_kernels(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    cu_seqlens=None,
    *,
    gate=None,
    gate_norm_weight=None,
    config: SparseGDNConfig | None = None,
    kernel_config: SparseGDNKernelConfig | None = None,
    mask: torch.Tensor | None = None,
    plan: LaunchPlan | None = None,
    details: bool = True,
    bounded_inputs: bool = False,
    head_split: HeadSplit | None = None,
):
    """Intra → selection → main pass on validated, normalised inputs under ``config`` and ``kernel_config`` (None:
    their defaults); ``mask [N, P, Cmax]`` (bool) replaces the
    selected mask (the tiers still come from the selector), so that a test can hold the mask fixed. ``plan``: a
    :class:`LaunchPlan` of these sequences (default: :func:`plan_for`'s, kept per batch shape or offsets).
    ``details``: the selection carries its tiers, tier sizes and gains (False: the mask alone, as the main pass
    needs; the GPU selector's ``details``). ``bounded_inputs``: the caller's promise of unit keys and ``|β| <= 1``
    (:func:`run_intra`). ``head_split``: the inputs hold these heads of the layer; the selection (returned) is every
    pair's, the main pass runs this call's.

    Returns ``(o [B, T, HV, V], final_state [N, HV, K, V] float32, selection, layout)``.
    """
    config = config or SparseGDNConfig()
    kernel_config = kernel_config or SparseGDNKernelConfig()
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    dev = q.device
    if plan is None:
        plan = plan_for(B, T, cu_seqlens, dev)
    plan.check(B, T, cu_seqlens, dev)
    lengths, layout, chunk_bos, chunk_len = plan.lengths, plan.layout, plan.chunk_bos, plan.chunk_len
    # the kernels step from token to token by H·K (HV·V) elements: views such as a GDN layer's q, k and v (slices of
    # its conv output) are copied into that layout first
    qf, kf = q.reshape(B * T, H, K).contiguous(), k.reshape(B * T, H, K).contiguous()
    vf = v.reshape(B * T, HV, V).contiguous()
    gf = g.reshape(B * T, HV).contiguous()  # any float dtype: the kernels read g and beta in float32
    bf = beta.reshape(B * T, HV).contiguous()

    walk = resolve_walk(kernel_config, qf, vf, layout.NC) if layout.NC else None  # an empty batch runs no walk
    ct, gamma, score, scores = run_intra(kernel_config, walk, qf, kf, vf, gf, bf, chunk_bos, chunk_len, bounded_inputs)
    selection, prefix = run_selection(
        plan, score, gamma, H, config, gate, gate_norm_weight, details=details, kernel_config=kernel_config,
        head_split=head_split,
    )  # fmt: skip
    if mask is not None:
        selection = dataclasses.replace(selection, mask=mask.to(dev) & layout.grid_valid[:, None, :])
    own = selection
    if head_split is not None:
        own = dataclasses.replace(selection, mask=head_split.own_pairs(selection.mask, HV // H).contiguous())
    o, final = _main_pass(
        qf,
        kf,
        vf,
        gf,
        ct,
        gamma,
        own,
        layout,
        lengths,
        chunk_bos,
        chunk_len,
        initial_state,
        scale,
        config,
        kernel_config,
        any_mask=mask is not None,
        plan=plan,
        prefix=prefix,
        scores=scores,
        walk=walk,
    )
    return o.view(B, T, HV, V), final, selection, layout


def run_intra(
    kernel_config: SparseGDNKernelConfig, walk: tuple[str, int] | None, q, k, v, g, beta, chunk_bos, chunk_len,
    bounded_inputs: bool = False,
):  # fmt: skip
    """The intra stage as the op runs it for the main pass ``walk`` (:func:`resolve_walk`; None: no walk) on packed
    inputs: ``(ct, gamma, score, scores)``. A walk that reads stored scores gets them from intra's programs, which
    hold the chunk's keys already (``scores``, :func:`scores_buffer`; else None). The Gluon walk's tiles also hold
    the dense ``Ct`` after the scores, and on that path they are its only copy: ``ct`` is None (the entry kernel
    reads the tiles too). ``bounded_inputs``: the caller's promise of unit keys and ``|β| <= 1``, so the fp16 solve
    runs with no per-chunk range test (``intra_forward``'s ``f16_unchecked``)."""
    scores = None if walk is None else _scores_buffer(kernel_config, walk[0], q, v, chunk_bos.numel())
    tiles_only = walk is not None and walk[0] == "gluon"
    forms_scores = tiles_only and gluon_forms_scores(kernel_config)  # the tiles then take the dense Ct alone
    ct, gamma, score = intra_forward(
        k, v, g, beta, chunk_bos, chunk_len, num_warps=kernel_config.intra_warps,
        max_registers=kernel_config.intra_registers,
        q=None if scores is None or forms_scores else q, scores=scores, kept_blocks=not tiles_only,
        f16_unchecked=bounded_inputs,
    )  # fmt: skip
    return ct, gamma, score, scores


def run_selection(
    plan: LaunchPlan, score, gamma, heads: int, config: SparseGDNConfig, gate=None, gate_norm_weight=None, *,
    details: bool = True, kernel_config: SparseGDNKernelConfig | None = None, head_split: HeadSplit | None = None,
) -> tuple[Selection, torch.Tensor | None]:  # fmt: skip
    """The selection step of the op on intra's ``score, gamma [NC, HV]``: ``(selection, decay prefix [NC, HV]
    float64)``. The GPU selector takes the plan's tables and forms :func:`decay_prefix` with its statistics; layouts
    it does not cover run the specification's selector, and the prefix is None (the main pass forms it).
    ``kernel_config``: its ``select_kernel`` chooses the GPU selector's launches (None: the default config's). With a
    ``head_split`` the selection is every pair's of the layer (the prefix this call's heads')."""
    layout = plan.layout
    HV = score.shape[1]
    group = HV // heads
    if gpu_select.supports(layout) is not None:
        selection = select_events(layout, score.T, gamma.T, group, config, gate, gate_norm_weight, head_split)
        return selection, None
    ratios = tuple(config.tier_ratios)
    pairs = heads if head_split is None else head_split.total // group
    prefix = torch.empty(layout.NC, HV, dtype=torch.float64, device=score.device)
    short = {"auto": None, "one": True, "three": False}[(kernel_config or SparseGDNKernelConfig()).select_kernel]
    selection = gpu_select.select_events_gpu(
        layout, score, gamma, group, config, gate, gate_norm_weight, tier_k=plan.tier_k(ratios),
        table=plan.tier_table(pairs, ratios), index=plan.index, details=details, decay_prefix=prefix,
        short=short if head_split is None else False, head_split=head_split,
    )  # fmt: skip
    return selection, prefix


def _segments(plan: LaunchPlan | None, lengths, parallel_width: int, slots: int, device, length: int | None):
    """The segments of ``length`` chunks (None: planned), kept by ``plan`` when there is one."""
    if plan is not None:
        return plan.segments(parallel_width, slots, length)
    return plan_segments(lengths, parallel_width, slots, device, length)


TRITON_BLOCK_V = 32
"""The Triton walk's and the csr pass's value tile where ``SparseGDNKernelConfig.block_v`` is None."""
GLUON_MIN_CHUNKS = 256
"""``walk_kernel="auto"`` takes the Gluon walk from this many chunks in the batch (16K tokens) up, where it
measured faster on the H200 (``bench gdn --walk-kernel auto,triton``: whole op with the Gluon / Triton walk 0.63 /
0.70 ms at 16K, 4.71 / 5.19 at 128K); below, the call is host-bound and the Gluon walk's main pass was slower too
(op 0.53 / 0.38 ms at 8K, 0.68 / 0.30 at 4K; docs/kernel-log.md)."""


def resolve_walk(
    config: SparseGDNKernelConfig, q: torch.Tensor, v: torch.Tensor, chunks: int | None = None
) -> tuple[str, int]:
    """``(kernel, block_v)`` of the main pass for ``q [T, H, K]``, ``v [T, HV, V]`` (``chunks`` chunks in the batch;
    None: many) under the kernel config ``config``: ``"gluon"`` where ``config.walk_kernel`` is ``"gluon"``, or
    ``"auto"`` and the
    Gluon walk runs this call (:func:`walk_gluon.supports`, the K S correction, stored scores or inline ones where
    its output role forms them, :func:`walk_gluon.inline_supported`) and the batch has
    :data:`GLUON_MIN_CHUNKS` chunks, else ``"triton"``; ``block_v`` is ``config.block_v`` or the kernel's own, at
    most V. Raises ``ValueError`` naming the reason where ``walk_kernel="gluon"`` cannot run the call."""
    V = v.shape[-1]
    triton = "triton", min(config.block_v or TRITON_BLOCK_V, V)
    short = config.walk_kernel == "auto" and chunks is not None and chunks < GLUON_MIN_CHUNKS
    if config.main_pass != "walk" or config.walk_kernel == "triton" or short:
        return triton
    block_v = config.block_v or walk_gluon.BLOCK_V
    reason = walk_gluon.supports(q, v, block_v)
    if reason is None and config.walk_correction != "ks":
        reason = f"walk_correction={config.walk_correction!r}: the Gluon walk forms the K S correction"
    if reason is None and config.walk_output_role:
        reason = walk_gluon.output_role_supported(block_v, config.walk_warp_specialised)
    if reason is None and config.walk_scores == "inline":
        reason = walk_gluon.inline_supported(block_v, config.walk_output_role, config.walk_warp_specialised)
    if reason is not None and config.walk_kernel == "gluon":
        raise ValueError(f"SparseGDN walk_kernel='gluon' cannot run this call: {reason}")
    return triton if reason is not None else ("gluon", block_v)


def scores_buffer(config: SparseGDNKernelConfig, q: torch.Tensor, v: torch.Tensor, chunks: int) -> torch.Tensor | None:
    """The buffer intra fills for the main pass over ``chunks`` chunks of ``q [T, H, K]``, ``v [T, HV, V]``
    (``intra_forward(q=, scores=)``): ``[chunks, HV, rows, 64]`` in q's dtype, rows per :func:`_score_rows` — or
    None where the walk reads no stored scores."""
    return _scores_buffer(config, resolve_walk(config, q, v, chunks)[0], q, v, chunks) if chunks else None


def gluon_forms_scores(config: SparseGDNKernelConfig) -> bool:
    """Whether the Gluon walk forms its intra-chunk scores itself: in its output role
    (``SparseGDNKernelConfig.walk_output_role``, which :func:`resolve_walk` requires for ``walk_scores="inline"``)
    unless the scores are asked to be ``"stored"``. Intra then reads no q and writes each tile's dense ``Ct`` alone.
    Else the walk reads the scores intra stores."""
    return config.walk_output_role and config.walk_scores != "stored"


def _scores_buffer(config, kernel: str, q, v, chunks: int) -> torch.Tensor | None:
    if not _reads_scores(config, kernel, chunks):
        return None
    return torch.empty(chunks, v.shape[1], _score_rows(kernel), 64, dtype=q.dtype, device=q.device)


def _score_rows(kernel: str) -> int:
    """Rows per (chunk, value head) of the stored-scores buffer the walk ``kernel`` reads: the Gluon walk's tiles
    hold the dense ``Ct`` after the scores (``walk_gluon.TILE_ROWS``), the Triton walk's the scores alone."""
    return walk_gluon.TILE_ROWS if kernel == "gluon" else 64


def _reads_scores(config: SparseGDNKernelConfig, kernel: str, chunks: int) -> bool:
    """Whether the main pass over ``chunks`` chunks with the walk resolved to ``kernel`` (:func:`resolve_walk`)
    reads stored intra-chunk scores: the Gluon walk always does, the Triton walk where :func:`stores_scores` says,
    the csr pass never."""
    if config.main_pass != "walk" or chunks == 0:
        return False
    return kernel == "gluon" or stores_scores(config, chunks)


def _main_pass(
    q,
    k,
    v,
    g,
    ct,
    gamma,
    selection: Selection,
    layout: ChunkLayout,
    lengths,
    chunk_bos,
    chunk_len,
    initial_state,
    scale,
    config: SparseGDNConfig,
    kernel_config: SparseGDNKernelConfig,
    *,
    any_mask: bool = False,
    state_dtype: torch.dtype | None = None,
    plan: LaunchPlan | None = None,
    prefix: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    walk: tuple[str, int] | None = None,
):
    """Recurrence and output on packed inputs (``kernel_config.main_pass``): ``(o [T, HV, V], final_state [N, HV, K, V]
    float32)``; ``plan`` keeps the segment plan between calls; ``prefix``: :func:`decay_prefix` of ``gamma`` where
    the caller has it (the GPU selector forms it), else formed here when needed; ``scores``: the stored intra-chunk
    scores ``[NC, HV, 64, 64]`` where the caller has them (intra stores them, :func:`scores_buffer`) — for the
    Gluon walk ``[NC, HV, 128, 64]``, each chunk's scores then its dense ``Ct`` (a 64-row buffer gets the dense
    ``Ct`` appended here) — else formed here by ``sparse_gdn_fwd_kernel_scores`` when the walk reads them;
    ``walk``: :func:`resolve_walk`'s ``(kernel, block_v)`` for this call where the caller has resolved it.
    ``ct``: the kept blocks ``[NC, HV, 7, 16, 16]``; None only where the Gluon walk runs and ``scores`` holds its
    128-row tiles (intra then stores the coefficients there alone, :func:`run_intra`).

    ``any_mask``: ``selection.mask`` does not come from the selector run with ``config`` (the csr pass then sizes its
    event buffers for every chunk). ``state_dtype``: dtype of the csr pass's stored states after each event
    (default: the input dtype, as FLA stores its chunk states; the recurrence itself always runs in fp32).
    """
    Ttot, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    dev = q.device
    o = torch.empty(Ttot, HV, V, dtype=q.dtype, device=dev)
    ht = torch.empty(layout.N, HV, K, V, dtype=torch.float32, device=dev)
    for n, length in enumerate(lengths):  # an empty sequence passes its initial state through
        if length == 0:
            ht[n] = 0 if initial_state is None else initial_state[n].float()
    if layout.NC == 0:
        return o, ht
    kernel, BV = walk or resolve_walk(kernel_config, q, v, layout.NC)
    gluon_walk = kernel == "gluon"
    if ct is None and not (gluon_walk and scores is not None and scores.shape[2] == walk_gluon.TILE_ROWS):
        raise ValueError(
            "SparseGDN main pass: ct (the kept coefficient blocks) is needed unless the Gluon walk runs with its "
            f"[NC, HV, {walk_gluon.TILE_ROWS}, 64] tiles as scores"
        )
    forms_scores = gluon_walk and gluon_forms_scores(kernel_config)
    if gluon_walk:  # the tiles first: the entry kernel reads its Ct there too
        scores = _gluon_tiles(q, k, g, ct, scores, chunk_bos, chunk_len, layout.NC, forms_scores)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if q.is_cuda else 1
    # same grid either way; the Gluon walk's shared memory sets its resident programs
    slots = sms * (
        walk_gluon.ctas_per_sm(kernel_config.walk_stages) if gluon_walk else resident_programs(kernel_config.main_warps)
    )
    segs = _segments(plan, lengths, HV * (V // BV), slots, dev, kernel_config.segment_chunks)
    mask = selection.mask.contiguous().view(torch.uint8)  # the GPU selector's own bytes: no copy
    h0 = initial_state.float().contiguous() if initial_state is not None else ht
    tau = math.inf if config.warmup_log_decay is None else float(config.warmup_log_decay)
    geometry = dict(P=H, CMAX=max(layout.Cmax, 1), H=H, HV=HV, K=K, V=V, BV=BV, IEEE=q.dtype == torch.float32)
    grid = (segs.count * HV * (V // BV),)  # segment-major: the plan's longest segments start first
    # One segment per sequence: the main pass starts from the initial state; several: entry states first.
    several = segs.count > sum(1 for n in lengths if n > 0)
    entry = torch.empty(segs.count, HV, K, V, dtype=torch.float32, device=dev) if several else ht
    if prefix is None and (several or kernel_config.main_pass == "csr"):  # a walk from the start needs no prefix
        prefix = decay_prefix(gamma, layout)
    if several:
        fast(sparse_gdn_fwd_kernel_entry)[grid](
            k,
            v,
            g,
            scores if gluon_walk else ct,
            mask,
            prefix,
            h0,
            entry,
            segs.seq,
            segs.c0,
            segs.chunk0,
            chunk_bos,
            chunk_len,
            tau,
            HAS_H0=initial_state is not None,
            SEARCH_STEPS=search_steps(layout.Cmax),
            KS_CORRECTION=kernel_config.walk_correction == "ks",
            CT_TILES=gluon_walk,
            num_warps=kernel_config.main_warps,
            **geometry,
        )
    if kernel_config.main_pass == "csr":
        csr = build_event_csr(selection.mask, event_capacity(lengths, H, config, any_mask))
        states = torch.empty(csr.capacity, HV // H, K, V, dtype=state_dtype or q.dtype, device=dev)
        u_new = torch.empty(csr.capacity, HV // H, 64, V, dtype=q.dtype, device=dev)
        total = torch.zeros(layout.N, HV, dtype=torch.float64, device=dev).index_add_(
            0, layout.chunk_seq, gamma.double()
        )
        fast(sparse_gdn_fwd_kernel_recur)[grid](
            k,
            v,
            g,
            ct,
            prefix,
            total,
            h0,
            entry,
            csr.event_index,
            csr.event_chunk,
            u_new,
            states,
            ht,
            segs.seq,
            segs.c0,
            segs.c1,
            segs.chunk0,
            segs.nchunks,
            chunk_bos,
            chunk_len,
            HAS_H0=initial_state is not None,
            HAS_ENTRY=several,
            num_warps=kernel_config.main_warps,
            **geometry,
        )
        groups = _segments(plan, lengths, HV, slots, dev, 2)  # the output groups: chunk pairs (2r, 2r + 1)
        fast(sparse_gdn_fwd_kernel_output)[(groups.count, HV, V // BV)](
            q,
            k,
            v,
            g,
            ct,
            mask,
            prefix,
            gamma,
            h0,
            csr.event_index,
            csr.event_chunk,
            u_new,
            states,
            o,
            groups.seq,
            groups.c0,
            segs.chunk0,
            segs.nchunks,
            chunk_bos,
            chunk_len,
            scale,
            HAS_H0=initial_state is not None,
            GROUPED=config.output == "grouped",
            num_warps=kernel_config.main_warps,
            num_stages=OUTPUT_NUM_STAGES,
            **geometry,
        )
        return o, ht
    if gluon_walk:
        walk_gluon.run_walk(
            q, k, v, g, mask, h0, entry, o, scores, ht, segs, chunk_bos, chunk_len, scale,
            P=H, CMAX=geometry["CMAX"], block_v=BV, has_h0=initial_state is not None, has_entry=several,
            grouped=config.output == "grouped", output_role=kernel_config.walk_output_role, inline_scores=forms_scores,
            kernel_config=kernel_config,
        )  # fmt: skip
        return o, ht
    stored = stores_scores(kernel_config, layout.NC)
    if not stored:
        scores = o  # a pointer the walk does not read when it forms its scores inline
    elif scores is None:
        scores = _stored_scores(q, k, g, chunk_bos, chunk_len, layout.NC, HV, 64)
    fast(sparse_gdn_fwd_kernel_fused)[grid](
        q,
        k,
        v,
        g,
        ct,
        mask,
        h0,
        entry,
        o,
        scores,
        ht,
        segs.seq,
        segs.c0,
        segs.c1,
        segs.chunk0,
        segs.nchunks,
        chunk_bos,
        chunk_len,
        scale,
        HAS_H0=initial_state is not None,
        HAS_ENTRY=several,
        STORE_FINAL=True,
        GROUPED=config.output == "grouped",
        KS_CORRECTION=kernel_config.walk_correction == "ks",
        HAS_SCORES=stored,
        num_warps=kernel_config.main_warps,
        **geometry,
    )
    return o, ht


def _stored_scores(q, k, g, chunk_bos, chunk_len, chunks: int, HV: int, rows: int) -> torch.Tensor:
    """``[chunks, HV, rows, 64]`` in q's dtype with the stored scores in rows 0-63, formed by
    ``sparse_gdn_fwd_kernel_scores`` for main-pass callers that bring none (the op has intra store them)."""
    H, K = q.shape[1], q.shape[2]
    scores = torch.empty(chunks, HV, rows, 64, dtype=q.dtype, device=q.device)
    ieee, fast_exp = q.dtype == torch.float32, q.is_cuda  # decays as intra forms them (interpreter: no inline asm)
    fast(sparse_gdn_fwd_kernel_scores)[(chunks, H)](
        q, k, g, scores, chunk_bos, chunk_len, H=H, HV=HV, K=K, IEEE=ieee, ROWS=rows, FAST_EXP=fast_exp
    )
    return scores


def _gluon_tiles(q, k, g, ct, scores, chunk_bos, chunk_len, chunks: int, forms_scores: bool) -> torch.Tensor:
    """The Gluon walk's ``[chunks, HV, 128, 64]`` tiles (scores, then the dense ``Ct``): ``scores`` itself where it
    is one (what the op passes); a caller's 64-row scores, or none, get the dense ``Ct`` of ``ct`` appended (a walk
    that ``forms_scores`` gets the ``Ct`` rows alone)."""
    if scores is not None and scores.shape[2] == walk_gluon.TILE_ROWS:
        return scores
    if forms_scores:
        tiles = torch.empty(chunks, ct.shape[1], walk_gluon.TILE_ROWS, 64, dtype=q.dtype, device=q.device)
        tiles[:, :, 64:] = walk_gluon.dense_coefficients(ct)
        return tiles
    if scores is None:
        tiles = _stored_scores(q, k, g, chunk_bos, chunk_len, chunks, ct.shape[1], walk_gluon.TILE_ROWS)
        tiles[:, :, 64:] = walk_gluon.dense_coefficients(ct)
        return tiles
    return torch.cat([scores, walk_gluon.dense_coefficients(ct)], dim=2)
