"""The distillation objective: rest-bucket KL (a worked example by hand), candidates, teacher scores and pooling."""

import math

import pytest
import torch

from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.ops.sparse_attn.naive import (
    compress_keys_ref,
    forced_blocks,
    infllmv2_scores_ref,
    visible_compressed,
)
from longsparse.train.forecast import SHORT_CONTEXT_SPARSE
from longsparse.train.objective import (
    candidate_mask,
    check_fine_grid,
    dynamic_budget,
    pool_fine_to_student,
    rest_bucket_kl,
    student_logits,
    supervised_positions,
    teacher_mass_recall,
    teacher_scores,
)
from tests.train.tiny import SMALL

TEACHER = torch.tensor([0.40, 0.30, 0.20, 0.10], dtype=torch.float64)
STUDENT = torch.tensor([0.35, 0.25, 0.15, 0.25], dtype=torch.float64)
ALL = torch.ones(4, dtype=torch.bool)


def test_rest_bucket_kl_matches_a_worked_example_by_hand():
    # partitions (0.40, 0.30 | 0.30) and (0.35, 0.25 | 0.40), by hand
    by_hand = 0.40 * math.log(0.40 / 0.35) + 0.30 * math.log(0.30 / 0.25) + 0.30 * math.log(0.30 / 0.40)
    kl = rest_bucket_kl(TEACHER, STUDENT.log(), ALL, k=2)
    assert kl.item() == pytest.approx(by_hand, rel=1e-12)
    # the teacher is a sum of G softmaxes (any scale) and the student comes as logits (any shift): same value
    assert rest_bucket_kl(3 * TEACHER, STUDENT.log() + 7.0, ALL, k=2).item() == pytest.approx(by_hand, rel=1e-12)


def test_rest_bucket_punishes_mass_moved_outside_the_teachers_set():
    # a student that keeps the top-2 ratio (0.40 : 0.30) but puts more mass elsewhere: a top-2-only renormalised
    # KL would be 0; the rest bucket sees it
    student = torch.tensor([0.20, 0.15, 0.40, 0.25], dtype=torch.float64)
    kl = rest_bucket_kl(TEACHER, student.log(), ALL, k=2).item()
    by_hand = 0.40 * math.log(0.40 / 0.20) + 0.30 * math.log(0.30 / 0.15) + 0.30 * math.log(0.30 / 0.65)
    assert kl == pytest.approx(by_hand, rel=1e-12) and kl > 0.1


def test_rest_bucket_kl_only_reads_candidates_and_vanishes_on_a_matching_student():
    gen = torch.Generator().manual_seed(0)
    teacher = torch.rand(5, 7, 40, generator=gen, dtype=torch.float64)
    cand = torch.rand(7, 40, generator=gen) < 0.6
    cand[:, :12] = True
    kl = rest_bucket_kl(teacher, teacher.log(), cand, k=5)
    assert kl.shape == (5, 7) and kl.abs().max() < 1e-12
    # changing the student outside the candidates changes nothing; inside it costs
    student = teacher.log().masked_fill(~cand, 50.0)
    assert rest_bucket_kl(teacher, student, cand, k=5).abs().max() < 1e-12
    assert (rest_bucket_kl(teacher, torch.zeros_like(teacher), cand, k=5) > 0).all()


def test_rest_bucket_kl_gradient_matches_finite_differences():
    gen = torch.Generator().manual_seed(1)
    teacher = torch.rand(3, 17, generator=gen, dtype=torch.float64)
    logits = torch.randn(3, 17, generator=gen, dtype=torch.float64, requires_grad=True)
    cand = torch.ones(17, dtype=torch.bool)
    cand[:3] = False
    assert torch.autograd.gradcheck(lambda s: rest_bucket_kl(teacher, s, cand, k=4), (logits,))


@pytest.mark.parametrize(
    "k, message",
    [(0, "k must be a positive int"), (4, "at least k \\+ 1 = 5 candidates")],
    ids=["k0", "too-few-candidates"],
)
def test_rest_bucket_kl_rejects_bad_partitions(k, message):
    with pytest.raises(ValueError, match=message):
        rest_bucket_kl(TEACHER, STUDENT.log(), ALL, k=k)


def test_rest_bucket_kl_rejects_a_mask_that_does_not_broadcast():
    with pytest.raises(ValueError, match="must broadcast"):
        rest_bucket_kl(TEACHER, STUDENT.log(), torch.ones(3, dtype=torch.bool), k=2)


def test_teacher_mass_recall():
    assert teacher_mass_recall(TEACHER, STUDENT.log(), ALL, k=2).item() == pytest.approx(1.0)
    # the student's top 2 are positions 2 and 3: (0.2 + 0.1) / (0.4 + 0.3)
    student = torch.tensor([0.1, 0.1, 0.4, 0.4], dtype=torch.float64)
    assert teacher_mass_recall(TEACHER, student.log(), ALL, k=2).item() == pytest.approx(0.3 / 0.7)


def _pooled_blocks(j: int, config: SparseAttentionConfig, num_blocks: int) -> list[int]:
    P, R = config.pool_stride, config.pool_overlap
    return [b for b in range(num_blocks) if b * P - R <= j <= b * P + P - 1]


@pytest.mark.parametrize(
    "config",
    [
        SMALL,
        SparseAttentionConfig(block_size=16, init_blocks=0, window=16, topk=3, kernel_size=8, kernel_stride=4),
        SparseAttentionConfig(block_size=16, init_blocks=2, window=0, topk=5, kernel_size=16, kernel_stride=4),
        SparseAttentionConfig(block_size=32, init_blocks=1, window=64, topk=4, kernel_size=32, kernel_stride=16),
    ],
    ids=["init1-win32", "init0-win16", "init2-win0-k16s4", "b32-k32s16"],
)
def test_candidates_are_the_positions_pooled_into_a_choosable_block(config):
    """Brute force from the pooling and forced-block definitions of ``naive``: a compressed position is a candidate
    iff the query sees it and it is pooled into a causal block that is neither init nor local."""
    T = 203
    pos = torch.arange(T)
    N, NB = config.num_compressed(T), config.num_blocks(T)
    forced = forced_blocks(pos, NB, config)
    n_vis = visible_compressed(pos, config)
    expected = torch.zeros(T, N, dtype=torch.bool)
    for i in range(T):
        for j in range(int(n_vis[i])):
            blocks = _pooled_blocks(j, config, NB)
            expected[i, j] = any(b <= i // config.block_size and not forced[i, b] for b in blocks)
    assert torch.equal(candidate_mask(pos, N, config), expected)


def test_supervised_positions_have_more_than_k_candidates():
    k = dynamic_budget(SMALL)
    assert k == 4
    T = 203
    cand = candidate_mask(torch.arange(T), SMALL.num_compressed(T), SMALL)
    chosen = supervised_positions(T, SMALL, k)
    assert torch.equal(chosen, torch.nonzero(cand.sum(-1) > k)[:, 0])
    assert chosen.numel() > 0 and int(chosen[0]) > SMALL.window


def test_dynamic_budget_of_the_short_context_geometry():
    # 24 blocks = 1 init + 9 local (own block and 8 before) + 14 chosen
    assert SHORT_CONTEXT_SPARSE.budget_blocks == 24 and dynamic_budget(SHORT_CONTEXT_SPARSE) == 14


def _direct_teacher(q, k, positions, config, fine, scale):
    """Teacher scores straight from the definitions: InfLLM-V2 scores on the teacher grid (naive reference), then
    for each student position the max over the fine windows whose tokens lie inside its window; 0 where the
    student position is not visible."""
    N = config.num_compressed(k.shape[0])
    if fine is None:
        scores = infllmv2_scores_ref(q[None], compress_keys_ref(k[None], 8, 4)[0], positions[None], config, scale)[0]
    else:
        grid = SparseAttentionConfig(block_size=16, kernel_size=fine[0], kernel_stride=fine[1], window=0, topk=6)
        fine_scores = infllmv2_scores_ref(q[None], compress_keys_ref(k[None], *fine)[0], positions[None], grid, scale)[
            0
        ]
        scores = torch.empty(*fine_scores.shape[:-1], N, dtype=fine_scores.dtype)
        for j in range(N):
            lo, hi = j * config.kernel_stride, j * config.kernel_stride + config.kernel_size
            inside = [f for f in range(fine_scores.shape[-1]) if lo <= f * fine[1] and f * fine[1] + fine[0] <= hi]
            scores[..., j] = fine_scores[..., inside].amax(-1)
    visible = torch.arange(N) < visible_compressed(positions, config)[:, None]
    return scores.masked_fill(~visible, 0.0)


@pytest.mark.parametrize("fine", [(2, 1), (4, 2), None], ids=["fine-2-1", "fine-4-2", "coarse"])
def test_teacher_scores_match_a_direct_computation(fine):
    gen = torch.Generator().manual_seed(3)
    T, P = 151, 23
    q = torch.randn(P, 6, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(T, 2, 16, generator=gen, dtype=torch.float64)
    positions = torch.sort(torch.randperm(T, generator=gen)[:P]).values
    got = teacher_scores(q, k, positions, SMALL, fine=fine, chunk=5)
    expected = _direct_teacher(q, k, positions, SMALL, fine, 0.25)
    assert got.shape == (2, P, SMALL.num_compressed(T)) and got.dtype == torch.float64
    assert (got - expected).abs().max() < 1e-14
    # summed over G = 3 heads: every row's visible mass on the coarse grid is exactly 3
    if fine is None:
        assert torch.allclose(got.sum(-1)[:, positions >= 7], torch.tensor(3.0, dtype=torch.float64))


def test_pooling_odd_fine_lengths_and_no_output():
    fine = torch.arange(40.0).flip(0)
    out = pool_fine_to_student(fine, 2, 1, SMALL, 9)
    # position j covers fine j*4 .. j*4 + 6 (window 7 every 4): the max is its first entry on a decreasing row
    assert torch.equal(out, fine[torch.arange(9) * 4])
    assert pool_fine_to_student(fine, 2, 1, SMALL, 0).shape == (0,)
    with pytest.raises(ValueError, match="fine scores hold 40 positions, 43 needed"):
        pool_fine_to_student(fine, 2, 1, SMALL, 10)


@pytest.mark.parametrize(
    "grid, message",
    [
        ((3, 2), "multiple of its stride"),
        ((16, 1), "must tile"),
        ((2, 3), "multiple of its stride"),
        ((0, 1), "positive"),
    ],
    ids=["3-2", "too-wide", "2-3", "zero"],
)
def test_fine_grid_must_tile_the_student_grid(grid, message):
    with pytest.raises(ValueError, match=message):
        check_fine_grid(*grid, SMALL)


def test_student_logits_scale():
    gen = torch.Generator().manual_seed(4)
    f = torch.randn(5, 2, 16, generator=gen, dtype=torch.float64)
    keys = torch.randn(9, 2, 16, generator=gen, dtype=torch.float64)
    logits = student_logits(f, keys)
    assert logits.shape == (2, 5, 9)
    assert torch.allclose(logits[1, 3, 4], (f[3, 1] @ keys[4, 1]) / 4.0)
