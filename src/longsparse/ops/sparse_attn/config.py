"""The InfLLM-V2 block-sparse attention geometry shared by the selectors, the kernels and the cache.

Defaults are MiniCPM4.1-8B's ``sparse_config`` (block 64, init 1, window 2048, topk 64, compression 32/16,
dense_len 8192). Names follow that config; derived sizes are properties so that no caller recomputes them.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP_REDUCTIONS = ("sum", "max")


def _is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class SparseAttentionConfig:
    """Block-sparse attention with InfLLM-V2 block selection.

    ``block_size``     tokens per KV block (the unit of selection, attention and host<->GPU transfer).
    ``init_blocks``    leading blocks every query always attends (attention sinks).
    ``window``         local window in tokens: a query in block ``qb`` always attends blocks
                       ``qb - window // block_size ... qb`` (its own, partly filled block plus ``window // block_size``
                       full blocks before it; InfLLM-V2's ``max_pooling_1d`` forces exactly these).
    ``topk``           MiniCPM's ``sparse_config.topk``: the per-query budget beyond the local window. A query
                       attends at most ``budget_blocks = topk + window // block_size`` blocks *including* the
                       forced init and local blocks, as MiniCPM4's modeling code does (``self.topk = topk +
                       window // block_size`` fed to one top-k over scores in which forced blocks are +inf). With
                       the defaults: 96 blocks = 1 init + 33 local + 62 chosen by score.
    ``kernel_size``    compression window in tokens (mean of ``kernel_size`` keys) ...
    ``kernel_stride``  ... taken every ``kernel_stride`` tokens; only full windows exist.
    ``dense_len``      sequences shorter than this many tokens use dense causal attention (MiniCPM4: dense when
                       ``kv_len < dense_len``).
    ``neighbour_blocks`` selection rule: a candidate block also takes the scores of the ``neighbour_blocks`` blocks
                       before it, so the blocks right after a high-scoring block rank with it (text that runs on past
                       the end of a chosen block is read to its end). 0: InfLLM-V2's rule.
    ``group_reduce``   how InfLLM-V2's score combines the per-head softmaxes of a GQA group: ``"sum"`` (InfLLM-V2) or
                       ``"max"`` (a block one head needs is not outvoted by the others). Forecast scores have one head
                       per group and ignore it.
    ``tile_tokens``    kernel tiling only (the attention is the same): query tokens per program of the block-sparse
                       prefill kernel, which walks the union of their selections. ``None`` picks it by group size
                       (``select.default_tile_tokens``: 64 (token, head) rows, 4 tokens for MiniCPM4, 16 for
                       Qwen3.5); fewer tokens walk smaller unions with smaller MMAs (``scripts/tile_union.py``).
    """

    block_size: int = 64
    init_blocks: int = 1
    window: int = 2048
    topk: int = 64
    kernel_size: int = 32
    kernel_stride: int = 16
    dense_len: int = 8192
    neighbour_blocks: int = 0
    group_reduce: str = "sum"
    tile_tokens: int | None = None

    def __post_init__(self):
        for name in ("block_size", "kernel_size", "kernel_stride"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("init_blocks", "window", "topk", "dense_len", "neighbour_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if not _is_power_of_two(self.block_size) or self.block_size < 16:
            raise ValueError(f"block_size must be a power of two >= 16 (kernel tiles), got {self.block_size}")
        if self.window % self.block_size:
            raise ValueError(f"window={self.window} must be a multiple of block_size={self.block_size}")
        if self.block_size % self.kernel_stride:
            raise ValueError(
                f"kernel_stride={self.kernel_stride} must divide block_size={self.block_size} "
                "(each block then covers a whole number of compression strides)"
            )
        if self.kernel_size % self.kernel_stride:
            raise ValueError(f"kernel_size={self.kernel_size} must be a multiple of kernel_stride={self.kernel_stride}")
        if not _is_power_of_two(self.block_size // self.kernel_stride):
            raise ValueError(
                f"block_size / kernel_stride = {self.block_size // self.kernel_stride} must be a power of two"
            )
        if self.kernel_size > self.block_size + self.kernel_stride:
            raise ValueError(
                f"kernel_size={self.kernel_size} may exceed block_size + kernel_stride = "
                f"{self.block_size + self.kernel_stride} at most: a compressed window may reach back into the "
                "previous block only (the pooling kernels carry one block's tail)"
            )
        if self.tile_tokens is not None and (
            not isinstance(self.tile_tokens, int)
            or not _is_power_of_two(self.tile_tokens)
            or not 1 <= self.tile_tokens <= 16
            or self.block_size % self.tile_tokens
        ):
            raise ValueError(
                f"tile_tokens must be None or a power of two in [1, 16] dividing block_size={self.block_size}, "
                f"got {self.tile_tokens!r}"
            )
        if self.group_reduce not in GROUP_REDUCTIONS:
            raise ValueError(f"group_reduce must be one of {', '.join(GROUP_REDUCTIONS)}, got {self.group_reduce!r}")
        if self.topk < self.init_blocks + 1:
            raise ValueError(
                f"topk={self.topk} must be at least init_blocks + 1 = {self.init_blocks + 1} so that the forced "
                "init and local blocks always fit in the budget"
            )

    @property
    def local_blocks(self) -> int:
        """Full blocks of the local window before the query's own block (MiniCPM4: 2048 / 64 = 32)."""
        return self.window // self.block_size

    @property
    def budget_blocks(self) -> int:
        """Most blocks one query attends in sparse mode, forced ones included (MiniCPM4: 96)."""
        return self.topk + self.local_blocks

    @property
    def pool_stride(self) -> int:
        """Compressed positions per block: block ``b`` starts at compressed position ``b * pool_stride``."""
        return self.block_size // self.kernel_stride

    @property
    def pool_overlap(self) -> int:
        """Compressed windows of block ``b - 1`` that reach into block ``b`` (``kernel_size / kernel_stride - 1``)."""
        return self.kernel_size // self.kernel_stride - 1

    @property
    def pool_reach(self) -> int:
        """Compressed positions before block ``b``'s own that its score pools: the windows of block ``b − 1`` reaching
        into it, and all windows of the ``neighbour_blocks`` blocks before it."""
        return self.pool_overlap + self.neighbour_blocks * self.pool_stride

    @property
    def default_rules(self) -> bool:
        """Whether the selection rules are InfLLM-V2's own (no neighbour blocks, group sum)."""
        return self.neighbour_blocks == 0 and self.group_reduce == "sum"

    @property
    def pool_kernel(self) -> int:
        """Compressed positions max-pooled onto one block: every window that overlaps it (MiniCPM4: 5)."""
        return self.pool_stride + self.pool_overlap

    def decode_width(self) -> int:
        """Width of a decode block list: the budget, or every block of a sequence still below ``dense_len``."""
        return max(self.budget_blocks, -(-self.dense_len // self.block_size))

    def num_compressed(self, length: int) -> int:
        """Compressed keys of a sequence of ``length`` tokens (full windows only)."""
        return 0 if length < self.kernel_size else (length - self.kernel_size) // self.kernel_stride + 1

    def num_blocks(self, length: int) -> int:
        """KV blocks of a sequence of ``length`` tokens, the partly filled last one included."""
        return -(-length // self.block_size)


MINICPM4 = SparseAttentionConfig()


TRAINING_FREE = SparseAttentionConfig(
    block_size=64, init_blocks=1, window=512, topk=16, kernel_size=32, kernel_stride=16, dense_len=0
)
"""The geometry of ``sparse`` / ``sparda`` attention on a checkpoint that was not trained with block-sparse attention
(Llama family, SmolLM2, Qwen3.5's attention layers): 64-token blocks, (32, 16) compression, 1 init block, a
512-token local window and 24 blocks per query (14 chosen); block-sparse from the first token."""


@dataclass(frozen=True)
class SelectKernelConfig:
    """How the block selectors' kernels run; every value selects the same blocks (``select.py``), only the time
    differs. Passed to the selectors as ``kernel_config=``; docs/kernel-log.md records the measurements behind the
    defaults.

    ``topk_arity``        thresholds the top-k counts per pass of its threshold search (a power of two >= 2; 2 is a
                          binary search). A wider search runs fewer dependent passes (log_ARITY of the key range)
                          but compares every key ARITY times a pass; 4 was the fastest of 2, 4, 8 and 16 on the H200
                          in decode and prefill.
    ``topk_bitonic``      find each row's threshold by a bitonic top-k of 64-bit (score, block) keys (``tl.topk``: a
                          fixed sequence of compare-and-swap steps) instead of the threshold search (a
                          data-dependent number of counting passes). Off: not yet timed against the search.
    ``topk_rows``         query rows a prefill top-k program searches at once (a power of two in [1, 16]; a plan tile
                          of more rows goes through them in turns). 1: a row's search stops as soon as its count is
                          exact, while rows searched together run as many passes as the slowest of them.
    ``topk_warps_scale``  multiplies the warps of every top-k program (a power of two; at most 16 warps), which are
                          set by the row's width (``select.topk_warps``: ~512 blocks a warp, 1 to 8). 1: those, the
                          fastest of 1 to 16 warps on the H200.
    ``min_topk_width``    narrowest row, in blocks, a prefill top-k program searches (a power of two;
                          ``select.topk_row_pieces``): early tokens, which see few blocks, are searched in rows this
                          wide rather than the whole sequence's.
    ``decode_fused_topk`` a decode selection runs its top-k in the scoring kernel — the last program of each
                          (sequence, KV head) row to finish selects the row's blocks — instead of in a launch of its
                          own: one launch less per selection. The row counters it needs
                          (``select.decode_topk_counters``) start at zero and are left at zero. Off: not yet timed.
    """

    topk_arity: int = 4
    topk_bitonic: bool = False
    topk_rows: int = 1
    topk_warps_scale: int = 1
    min_topk_width: int = 64
    decode_fused_topk: bool = False

    def __post_init__(self):
        for name in ("topk_bitonic", "decode_fused_topk"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        bounds = (
            ("topk_arity", 2, None),
            ("topk_rows", 1, 16),
            ("topk_warps_scale", 1, 16),
            ("min_topk_width", 1, None),
        )
        for name, low, high in bounds:
            value = getattr(self, name)
            power = isinstance(value, int) and not isinstance(value, bool) and _is_power_of_two(value)
            if not power or value < low or (high is not None and value > high):
                bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"{name} must be a power of two {bound}, got {value!r}")
