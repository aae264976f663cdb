"""Configuration of the SparseGDN operator: what it computes (the defaults of SparseGDN (Zhuang et al.,
arXiv:2610.41420) plus the ablation switches of its Sec. 3.5) and, apart, how its kernels run."""

from __future__ import annotations

from dataclasses import dataclass

SOLVES = ("block_adjacent", "full")
SELECTIONS = ("adaptive", "random", "all", "fixed_tiers", "uniform_random")
OUTPUTS = ("grouped", "per_chunk")
BACKENDS = ("auto", "torch", "triton")
MAIN_PASSES = ("walk", "csr")
WALK_CORRECTIONS = ("w", "ks")
WALK_SCORES = ("auto", "inline", "stored")
WALK_KERNELS = ("auto", "triton", "gluon")
SELECT_KERNELS = ("auto", "one", "three")
STORED_SCORES_MIN_CHUNKS = 128
"""With ``walk_scores="auto"``, the walk reads stored scores from this many chunks (8K tokens) in one call up."""
BLOCK_VS = (16, 32, 64, 128)
WARPS = (4, 8)
WALK_STAGES = (1, 2)
CHUNK = 64
REFERENCE_PAIRS = 16


@dataclass(frozen=True)
class SparseGDNConfig:
    """What ``sparse_chunk_gated_delta_rule`` computes: the paper's approximate operator and its ablations (fields that
    change the output; how the kernels run it is :class:`SparseGDNKernelConfig`).

    Attributes:
        tier_ratios: ``(ρ_L, ρ_M, ρ_H)``, the kept fraction of chunks of a low / mid / high tier pair; each tier keeps
            ``k = clip(round(ρ C), 2, C)`` chunks (the paper's Eq. 13). Strictly increasing, in ``(0, 1]``.
        solve: ``"block_adjacent"`` keeps the 7 diagonal and sub-diagonal 16×16 blocks of M⁻¹ (Eqs. 5–8);
            ``"full"`` uses the exact M⁻¹ (the "Full64" ablation; the torch backend only).
        selection: ``"adaptive"`` (the method), ``"random"`` (same tiers and per-pair counts, the chunk ranking
            replaced by a seeded hash), ``"all"`` (every event kept), ``"fixed_tiers"`` (tier counts fixed to
            ``fixed_tiers`` instead of chosen from the table, pair identities and ranking still adaptive).
            ``"uniform_random"`` is a diagnostic control, not a way to run the method: no tiers and no anchors, every
            pair keeps the chunk count of a mid pair (``k_M``) drawn by the seeded hash over all its chunks; the
            torch backend only.
        output: ``"grouped"`` (two-chunk groups sharing one entry state, Eqs. 22–25) or ``"per_chunk"`` (every chunk
            reads its own sparse entering state).
        visibility: use the output-gate visibility factor G_h in the upgrade gains; False sets G_h = 1.
        tail: rows of the chunk's U that form the tail score s (the paper: 16, i.e. positions 48..63; the kernels
            compute 16 only).
        lifetime_window: how many of the last chunks of a sequence average into the retention r_h (the paper: 16).
        seed: seed of the ``"random"`` selection, in ``[0, 2**32)``.
        fixed_tiers: ``(n_L, n_M, n_H)`` pair counts of ``"fixed_tiers"`` for 16 pairs (the paper's 9 / 4 / 3); other
            pair counts scale them like the tier table (docs/sparsegdn.md).
        warmup_log_decay: the GPU main pass walks the sequence in parallel segments; a segment rebuilds its entry
            state by replaying the selected chunks after the last point where the decay down to the segment start
            reaches ``e^-warmup_log_decay`` (12: a change of at most 6e-6 of the state's norm for L2-normalised keys).
            ``None`` replays from the start of the sequence: exact, slower for long sequences. The torch backend
            is always exact.
    """

    tier_ratios: tuple[float, float, float] = (0.08, 0.30, 0.95)
    solve: str = "block_adjacent"
    selection: str = "adaptive"
    output: str = "grouped"
    visibility: bool = True
    tail: int = 16
    lifetime_window: int = 16
    seed: int = 0
    fixed_tiers: tuple[int, int, int] = (9, 4, 3)
    warmup_log_decay: float | None = 12.0

    def __post_init__(self):
        ratios = tuple(self.tier_ratios)
        if len(ratios) != 3 or not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in ratios):
            raise ValueError(f"tier_ratios must be three numbers (low, mid, high), got {self.tier_ratios!r}")
        if not (0 < ratios[0] < ratios[1] < ratios[2] <= 1):
            raise ValueError(f"tier_ratios must satisfy 0 < low < mid < high <= 1, got {self.tier_ratios!r}")
        object.__setattr__(self, "tier_ratios", tuple(float(r) for r in ratios))
        _check_choices(self, (("solve", SOLVES), ("selection", SELECTIONS), ("output", OUTPUTS)))
        _check_bools(self, ("visibility",))
        for name, low, high in (("tail", 1, CHUNK), ("lifetime_window", 1, None)):
            value = getattr(self, name)
            if not _is_int(value) or value < low or (high is not None and value > high):
                bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), got {self.seed!r}")
        counts = tuple(self.fixed_tiers)
        if len(counts) != 3 or not all(_is_int(n) and n >= 0 for n in counts) or sum(counts) != REFERENCE_PAIRS:
            raise ValueError(
                f"fixed_tiers must be three non-negative integers (low, mid, high) summing to {REFERENCE_PAIRS}, "
                f"got {self.fixed_tiers!r}"
            )
        object.__setattr__(self, "fixed_tiers", counts)
        w = self.warmup_log_decay
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0):
            raise ValueError(f"warmup_log_decay must be a positive number or None, got {w!r}")


@dataclass(frozen=True)
class SparseGDNKernelConfig:
    """How ``sparse_chunk_gated_delta_rule`` runs: which backend, main pass and kernel forms, and their launch
    settings. Every value computes the operator of the :class:`SparseGDNConfig` it runs with; they differ in speed
    and in rounding (fp32 accumulation order, which intermediates are rounded to the input dtype). The defaults are
    the fastest forms measured on the H200; docs/kernel-log.md records the measurements.

    Attributes:
        backend: ``"torch"`` (the executable specification), ``"triton"`` (the GPU kernels; a clear error where
            they do not apply) or ``"auto"`` (the kernels when the inputs are on a GPU they support, else torch).
        segment_chunks: chunks per parallel segment of the GPU main pass (even); ``None`` picks the length of the
            shortest estimated makespan (``launch.segment_length``).
        main_pass: how the GPU path runs the recurrence and the output: ``"walk"`` (``kernels/fused.py``) walks
            every chunk in one kernel and pays the W correction of skipped chunks times 0; ``"csr"``
            (``kernels/recur.py`` + ``kernels/output.py``) visits only the selected chunks of each (sequence, pair),
            stores U' and the state after each event, and computes the output in a chunk-parallel kernel. The walk
            is the faster.
        walk_correction: how the walk forms a selected chunk's state correction ``W S``: ``"ks"`` as
            ``Ct (e^G ⊙ K S)`` — fewer FLOPs per chunk and value tile, by default; ``"w"`` as ``(Ct e^G K) S`` — W
            depends only on the chunk, two products on the state's chain (the csr pass always uses it).
        walk_scores: where the walk's intra-chunk scores ``A = Q Kᵀ ⊙ e^{G_i − G_j}`` come from: ``"inline"`` —
            each walk program forms them for its chunk, value head and V tile (the Gluon walk only with its output
            role, ``walk_output_role``; otherwise "inline" runs the Triton walk); ``"stored"`` — a chunk-parallel
            kernel forms ``Q Kᵀ`` once per (chunk, head pair) and stores ``A`` per value head (``[NC, HV, 64, 64]``
            in the input dtype: 0.5 GiB at 128K in bf16, a sixth of q, k, v and o together), which the walk reads: a
            third fewer products on the walk's step.
            ``"auto"`` (default): the Gluon walk's output role forms them where that runs, else they are stored
            from ``STORED_SCORES_MIN_CHUNKS`` chunks (8K tokens) up; below, the call is bound by the host and the
            extra pass does not pay.
        block_v: columns of the value dimension one program of the GPU main pass holds (16, 32, 64 or 128; the
            whole of V when V is smaller). None (default): the kernel's own — 64 for the Gluon walk
            (``walk_gluon.BLOCK_V``), 32 for the Triton walk and the csr pass (``launch.TRITON_BLOCK_V``), each its
            fastest tile.
        intra_warps, main_warps: warps per program of the GPU intra kernel and of the main pass's kernels (4 or 8;
            4 is the faster everywhere measured).
        intra_registers: a cap on the registers per thread of the intra kernel the op runs, the kept-block one
            (ptxas ``maxnreg``, a multiple of 8 in [32, 255]; None: the compiler's choice). Default 128: four
            programs per SM instead of two for a kernel that waits on latency, with bit-equal coefficients; lower
            caps spill more than their extra programs bring.
        walk_kernel: which kernel runs the walk (``main_pass="walk"``): ``"triton"`` (``kernels/fused.py``, the
            reference: every dtype and head size, CPU interpreter included), ``"gluon"`` (``walk_gluon.py``: the same
            products in Triton's Gluon dialect — TMA-fed tiles, the state in wgmma accumulators; bf16/fp16, K = V =
            128, Hopper, ``walk_correction="ks"``, scores stored or formed by its output role; an error names what
            else it cannot run) or ``"auto"`` (default): the Gluon walk where it runs the call and the batch has
            ``launch.GLUON_MIN_CHUNKS`` chunks (16K tokens; shorter calls are bound by the host and faster with the
            Triton walk), else the Triton walk (:func:`launch.resolve_walk`). The entry kernel and intra are
            Triton's either way.
        walk_output_role: the Gluon walk's form with the output's products (``Q S_read``, ``A U``, the store) in a
            warpgroup of their own beside the two state warpgroups (the warp-specialised walk at 64-wide tiles:
            ``walk_kernel="auto"`` takes the Triton walk where a ``block_v`` other than 64 is asked for with it on,
            ``"gluon"`` refuses that by name). On by default (the faster); with ``walk_scores`` "auto" or "inline"
            that role also forms the chunk's scores, so intra reads no q and writes the tiles' ``Ct`` rows alone.
        walk_warp_specialised: at 64-wide tiles (``V = 128``), run the Gluon walk warp-specialised: one CTA per
            (segment, value head), two state warpgroups (the two V tiles) sharing each chunk's tiles, which a
            one-warp producer brings by TMA into a two-stage ring. False: the single-warpgroup form at 64 too (one
            program per V tile; the slower, kept for the 32-wide tile, measurements and tests). The output role
            needs it.
        walk_stages: chunk-tile stages (1 or 2) of the single-warpgroup Gluon walk (the warp-specialised form always
            has two). One stage lets two programs share an SM, two prefetch the next chunk's tiles but hold one
            program per SM; one was the faster.
        select_kernel: how the GPU selector runs (``select.py``): ``"three"`` — three launches (head statistics,
            pair ranking, masks) whose programs spread over the GPU; ``"one"`` — one launch, one program per
            sequence, for batches whose sequences have at most ``select.SHORT_CHUNKS`` chunks (8K tokens; longer ones
            are refused): two launches fewer where a short call is bound by the host; ``"auto"`` (default) — one
            launch for a single sequence of at most ``select.AUTO_SHORT_CHUNKS`` chunks (4K tokens), three otherwise
            (``select.auto_takes_one_launch``). The same decisions either way.
    """

    backend: str = "auto"
    segment_chunks: int | None = None
    main_pass: str = "walk"
    walk_correction: str = "ks"
    walk_scores: str = "auto"
    block_v: int | None = None
    intra_warps: int = 4
    main_warps: int = 4
    intra_registers: int | None = 128
    walk_kernel: str = "auto"
    select_kernel: str = "auto"
    walk_output_role: bool = True
    walk_warp_specialised: bool = True
    walk_stages: int = 1

    def __post_init__(self):
        choices = (
            ("backend", BACKENDS),
            ("main_pass", MAIN_PASSES),
            ("walk_correction", WALK_CORRECTIONS),
            ("walk_scores", WALK_SCORES),
            ("walk_kernel", WALK_KERNELS),
            ("select_kernel", SELECT_KERNELS),
        )
        _check_choices(self, choices)
        _check_bools(self, ("walk_output_role", "walk_warp_specialised"))
        L = self.segment_chunks
        if L is not None and (not _is_int(L) or L < 2 or L % 2):
            raise ValueError(f"segment_chunks must be an even integer >= 2 or None, got {L!r}")
        if self.block_v is not None and (self.block_v not in BLOCK_VS or isinstance(self.block_v, bool)):
            raise ValueError(f"block_v must be one of {BLOCK_VS} or None, got {self.block_v!r}")
        for name in ("intra_warps", "main_warps"):
            if getattr(self, name) not in WARPS or isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be one of {WARPS}, got {getattr(self, name)!r}")
        cap = self.intra_registers
        if cap is not None and (not _is_int(cap) or not 32 <= cap <= 255 or cap % 8):
            raise ValueError(f"intra_registers must be None or a multiple of 8 in [32, 255], got {cap!r}")
        if self.walk_stages not in WALK_STAGES or isinstance(self.walk_stages, bool):
            raise ValueError(f"walk_stages must be one of {WALK_STAGES}, got {self.walk_stages!r}")


def _check_choices(config, choices) -> None:
    for name, allowed in choices:
        if getattr(config, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(config, name)!r}")


def _check_bools(config, names) -> None:
    for name in names:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{name} must be a bool, got {getattr(config, name)!r}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
