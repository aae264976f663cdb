"""The Forecast distillation objective (SparDA (Fu et al., arXiv:2606.04511) Sec. 4.2, Eqs. 6–7) on one attention layer.

Shapes: ``P`` supervised query positions, ``Hkv`` GQA groups of ``G`` query heads, ``d`` head dim, ``N`` compressed
positions of the student's grid (``config.kernel_size / kernel_stride``, (32, 16) in the paper).

* **Teacher** ``[Hkv, P, N]``: ``Σ_g softmax(q_g K̃ᵀ · d^-½)`` over every causally visible key of the teacher grid (the
  InfLLM-V2 score, :func:`~longsparse.ops.sparse_attn.naive.infllmv2_scores_ref`). The fine teacher scores a
  ``(2, 1)`` grid and max-pools it onto the student's grid: student position ``j`` (tokens ``[j·s, j·s + l)``) takes the
  maximum over the fine windows that lie inside those tokens. The coarse teacher scores the student's grid itself.
* **Student** ``[Hkv, P, N]`` logits: ``f K̃ᵀ · d^-½`` with ``f`` the forecast vectors; its distribution is the
  softmax over the candidates only (below).
* **Candidates**: the compressed positions that can change a selection — those max-pooled into at least one block
  that is causal and neither an init nor a local block of the query. For a query in block ``qb`` they form one range
  ``[lo, hi)`` (:func:`candidate_range`). Init and local blocks are always attended, so nothing is learnt about them.
* **Rest-bucket KL**: the teacher's top ``k`` candidates stay separate, every other candidate is merged into one rest
  bucket, both sides are normalised over the candidates, and the loss is ``KL(teacher ‖ student)`` over those
  ``k + 1`` cells. A student that moves probability outside the teacher's set pays for it in the rest cell.
"""

from __future__ import annotations

import torch

from ..ops.sparse_attn.config import SparseAttentionConfig
from ..ops.sparse_attn.naive import compress_keys_ref, visible_compressed


def dynamic_budget(config: SparseAttentionConfig) -> int:
    """Blocks a query chooses by score once its init and local blocks are all present:
    ``budget_blocks − init_blocks − (local_blocks + 1)`` (14 for block 64, init 1, window 512, topk 16)."""
    return config.budget_blocks - config.init_blocks - config.local_blocks - 1


def candidate_range(positions: torch.Tensor, config: SparseAttentionConfig) -> tuple[int, torch.Tensor]:
    """``(lo, hi)``: query ``i``'s candidates are the compressed positions ``lo ≤ j < hi[i]`` (``hi`` has the shape of
    ``positions``; ``hi ≤ lo`` means none).

    Position ``j`` is max-pooled into block ``b`` iff ``b·P − R' ≤ j ≤ b·P + P − 1`` (``P = pool_stride``,
    ``R' = pool_overlap``; see ``naive.pool_blocks_ref``). The blocks that can be chosen are ``init_blocks ≤ b <
    qb − local_blocks``, so ``lo = init_blocks·P − R'`` (at least 0) and ``hi = (qb − local_blocks)·P``, capped by
    the visible count ``n_vis(i)`` (and ``hi = lo`` when no block is left between the init and local blocks).
    """
    P = config.pool_stride
    lo = max(config.init_blocks * P - config.pool_overlap, 0)
    qb = torch.div(positions, config.block_size, rounding_mode="floor")
    first_forced_local = qb - config.local_blocks
    hi = torch.minimum(first_forced_local * P, visible_compressed(positions, config))
    return lo, torch.where(first_forced_local > config.init_blocks, hi, torch.full_like(hi, lo))


def candidate_mask(positions: torch.Tensor, num_compressed: int, config: SparseAttentionConfig) -> torch.Tensor:
    """``[P, N]`` bool: candidate compressed positions of each query (see :func:`candidate_range`)."""
    lo, hi = candidate_range(positions, config)
    j = torch.arange(num_compressed, device=positions.device)
    return (j >= lo) & (j < hi[:, None])


def supervised_positions(seq_len: int, config: SparseAttentionConfig, k: int) -> torch.Tensor:
    """``[M]`` int64 query positions of a ``seq_len``-token sequence that have more than ``k`` candidates (so the
    ``k + 1``-cell partition has a non-empty rest bucket): the positions where the selector makes a real choice."""
    pos = torch.arange(seq_len)
    lo, hi = candidate_range(pos, config)
    return pos[hi - lo > k]


def check_fine_grid(fine_size: int, fine_stride: int, config: SparseAttentionConfig) -> None:
    """ValueError unless every student window is a whole run of fine windows: ``fine_stride`` divides the student
    stride and ``kernel_size − fine_size``, and ``fine_size ≤ kernel_size``."""
    if not (isinstance(fine_size, int) and isinstance(fine_stride, int) and fine_size > 0 and fine_stride > 0):
        raise ValueError(f"fine grid must be positive ints, got ({fine_size!r}, {fine_stride!r})")
    if fine_size % fine_stride:
        raise ValueError(f"fine kernel size {fine_size} must be a multiple of its stride {fine_stride}")
    if (
        fine_size > config.kernel_size
        or config.kernel_stride % fine_stride
        or (config.kernel_size - fine_size) % fine_stride
    ):
        raise ValueError(
            f"fine grid ({fine_size}, {fine_stride}) must tile the student grid ({config.kernel_size}, "
            f"{config.kernel_stride}): size <= {config.kernel_size}, stride dividing {config.kernel_stride} and "
            f"{config.kernel_size} - size"
        )


def pool_fine_to_student(
    fine: torch.Tensor, fine_size: int, fine_stride: int, config: SparseAttentionConfig, num_compressed: int
) -> torch.Tensor:
    """Max-pool fine-grid scores ``[..., Nf]`` onto the student grid ``[..., num_compressed]``.

    Student position ``j`` covers tokens ``[j·s, j·s + l)``; fine position ``j'`` covers ``[j'·s_f, j'·s_f + l_f)``
    and lies inside iff ``j·s/s_f ≤ j' ≤ (j·s + l − l_f)/s_f``: a window of ``(l − l_f)/s_f + 1`` fine positions
    every ``s/s_f`` (31 every 16 for (2, 1) → (32, 16)).
    """
    check_fine_grid(fine_size, fine_stride, config)
    width = (config.kernel_size - fine_size) // fine_stride + 1
    step = config.kernel_stride // fine_stride
    if num_compressed == 0:
        return fine.new_empty(*fine.shape[:-1], 0)
    need = (num_compressed - 1) * step + width
    if fine.shape[-1] < need:
        raise ValueError(f"fine scores hold {fine.shape[-1]} positions, {need} needed for {num_compressed} outputs")
    flat = fine[..., :need].reshape(-1, 1, need)
    return torch.nn.functional.max_pool1d(flat, width, step).view(*fine.shape[:-1], num_compressed)


def grid_scores(
    q: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, grid: SparseAttentionConfig, scale: float
) -> torch.Tensor:
    """``[Hkv, P, N]``: ``Σ_g softmax(q_g keysᵀ · scale)`` over the keys of ``grid`` each query sees, 0 elsewhere.

    ``q [P, Hq, d]`` at ``positions [P]``; ``keys [N, Hkv, d]`` compressed with ``grid``'s kernel size and stride.
    The InfLLM-V2 score of ``naive.infllmv2_scores_ref`` (which writes −inf where this writes 0), computed in place
    in float32 (float64 for float64 input) to keep the ``[Hkv, G, P, N]`` logits the only large buffer.
    """
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    P, Hq, d = q.shape
    N, Hkv = keys.shape[0], keys.shape[1]
    qg = q.to(dt).view(P, Hkv, Hq // Hkv, d).permute(1, 2, 0, 3)
    logits = torch.matmul(qg * scale, keys.to(dt).permute(1, 2, 0)[:, None])
    visible = torch.arange(N, device=q.device) < visible_compressed(positions, grid)[:, None]
    logits.masked_fill_(~visible, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if not bool(visible.any(-1).all()):
        probs.nan_to_num_(0.0)  # a query that sees no key has no distribution
    return probs.sum(dim=1)


def _fine_grid_config(fine: tuple[int, int], config: SparseAttentionConfig) -> SparseAttentionConfig:
    """A geometry whose compression is the fine grid (only its kernel size and stride are read)."""
    return SparseAttentionConfig(
        block_size=config.block_size, kernel_size=fine[0], kernel_stride=fine[1], window=0, topk=config.topk
    )


@torch.no_grad()
def teacher_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    config: SparseAttentionConfig,
    *,
    fine: tuple[int, int] | None = (2, 1),
    scale: float | None = None,
    chunk: int = 128,
) -> torch.Tensor:
    """Teacher scores ``[Hkv, P, N]`` on the student's grid (``N = config.num_compressed(T)``), float32 (float64 for
    float64 input); entries that are not causally visible on the student grid are 0.

    ``q [P, Hq, d]`` at ``positions [P]``; ``k [T, Hkv, d]`` every key of the layer. ``fine``: the teacher grid
    ``(kernel_size, kernel_stride)``, max-pooled onto the student grid; None scores the student grid itself (the
    paper's coarse-teacher ablation, its Table 6). ``scale`` defaults to ``d^-½`` (τ = √d). Queries are processed
    ``chunk`` at a time: the fine scores of a chunk take ``Hq · chunk · T`` floats.
    """
    T, d = k.shape[0], k.shape[-1]
    scale = d**-0.5 if scale is None else scale
    N = config.num_compressed(T)
    if fine is None:
        grid = config
        keys = compress_keys_ref(k[None], config.kernel_size, config.kernel_stride)[0][0]
    else:
        check_fine_grid(*fine, config)
        grid = _fine_grid_config(fine, config)
        keys = compress_keys_ref(k[None], *fine)[0][0]
    outs = [q.new_zeros(k.shape[1], 0, N, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)]
    for start in range(0, q.shape[0], chunk):
        pos = positions[start : start + chunk]
        s = grid_scores(q[start : start + chunk], keys, pos, grid, scale)
        if fine is not None:
            s = pool_fine_to_student(s, *fine, config, N)
        visible = torch.arange(N, device=q.device) < visible_compressed(pos, config)[:, None]
        outs.append(s.masked_fill_(~visible, 0.0))
    return torch.cat(outs, dim=1)


def student_logits(f: torch.Tensor, k_cmp: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """``[Hkv, P, N]`` logits ``f · K̃ · scale`` of forecast vectors ``f [P, Hkv, d]`` against the student-grid keys
    ``k_cmp [N, Hkv, d]`` (``scale`` defaults to ``d^-½``; its softmax is the student distribution)."""
    scale = f.shape[-1] ** -0.5 if scale is None else scale
    return torch.einsum("phd,nhd->hpn", f, k_cmp.to(f.dtype)) * scale


def _partition(teacher: torch.Tensor, candidates: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if candidates.dtype != torch.bool:
        raise ValueError(f"candidates must be a bool mask, got {candidates.dtype}")
    try:
        candidates = candidates.expand_as(teacher)
    except RuntimeError as exc:
        raise ValueError(
            f"candidates {list(candidates.shape)} must broadcast to teacher {list(teacher.shape)}"
        ) from exc
    if not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    fewest = int(candidates.sum(-1).min()) if candidates.numel() else k + 1
    if fewest < k + 1:
        raise ValueError(f"every row needs at least k + 1 = {k + 1} candidates, one has {fewest}")
    t = teacher.clamp_min(0).masked_fill(~candidates, 0)
    top = t.masked_fill(~candidates, -1.0).topk(k, dim=-1).indices
    in_top = torch.zeros_like(candidates).scatter_(-1, top, True)
    return t, in_top


def rest_bucket_kl(
    teacher: torch.Tensor, student_logits: torch.Tensor, candidates: torch.Tensor, k: int
) -> torch.Tensor:
    """``KL(teacher ‖ student)`` over the ``k + 1``-cell partition, per row: ``[..., N] -> [...]``.

    ``teacher [..., N]``: non-negative scores (any scale; normalised over the candidates here). ``student_logits``:
    the student's logits (its distribution is their softmax over the candidates). ``candidates`` (bool, broadcast to
    ``teacher``): which positions take part. The cells are the teacher's ``k`` largest candidates and the rest
    bucket (every other candidate); each row needs at least ``k + 1`` candidates. Differentiable in
    ``student_logits``.
    """
    t, in_top = _partition(teacher, candidates, k)
    candidates = candidates.expand_as(t)
    total = t.sum(-1, keepdim=True).clamp_min(torch.finfo(t.dtype).tiny)
    p = t / total
    p_top = torch.where(in_top, p, 0.0)
    p_rest = torch.where(candidates & ~in_top, p, 0.0).sum(-1)
    logits = student_logits.float() if student_logits.dtype != torch.float64 else student_logits
    log_norm = torch.logsumexp(logits.masked_fill(~candidates, float("-inf")), dim=-1)
    log_q = logits - log_norm[..., None]
    log_q_rest = torch.logsumexp(logits.masked_fill(~(candidates & ~in_top), float("-inf")), dim=-1) - log_norm
    kl_top = (torch.xlogy(p_top, p_top) - p_top * log_q.masked_fill(~in_top, 0.0)).sum(-1)
    kl_rest = torch.xlogy(p_rest, p_rest) - p_rest * log_q_rest
    return kl_top + kl_rest


@torch.no_grad()
def teacher_mass_recall(
    teacher: torch.Tensor, student_logits: torch.Tensor, candidates: torch.Tensor, k: int
) -> torch.Tensor:
    """Per row: the teacher's candidate mass on the student's ``k`` best candidates over its mass on its own ``k``
    best (1 = the student picks a set as good as the teacher's). A cheap training-time proxy on the compressed
    grid; the block-level recall of the dense attention mass is :mod:`longsparse.eval.recall`."""
    t, in_top = _partition(teacher, candidates, k)
    candidates = candidates.expand_as(t)
    chosen = student_logits.masked_fill(~candidates, float("-inf")).topk(k, dim=-1).indices
    best = torch.where(in_top, t, 0.0).sum(-1).clamp_min(torch.finfo(t.dtype).tiny)
    return t.gather(-1, chosen).sum(-1) / best
