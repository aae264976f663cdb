"""The persistent row-copy kernel (Triton's interpreter on CPU tensors) against its torch reference: every listed row
moves bit for bit, nothing else is touched, any CTA count works, bad input is refused."""

import pytest
import torch

from longsparse.ops.transfer import copy_rows, copy_rows_ref, default_cta_quota


def _rows(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=gen).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=gen).to(dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8)


CASES = {
    # id: (source rows, destination rows, row width, dtype, tasks, count, programs)
    "R9-E96-f32-M5-cta2": (9, 7, 96, torch.float32, 5, None, 2),
    "R13-E130-bf16-M7-count4-cta3": (13, 11, 130, torch.bfloat16, 7, 4, 3),
    "R20-E2x16x24-bf16-M11-cta16": (20, 12, 2 * 16 * 24, torch.bfloat16, 11, None, 16),
    "R6-E33-u8-M3-cta1": (6, 5, 33, torch.uint8, 3, None, 1),
    "R5-E10-f16-M4-count0": (5, 6, 10, torch.float16, 4, 0, 4),
}


@pytest.mark.parametrize("case", CASES)
def test_kernel_copies_listed_rows_bit_for_bit_and_nothing_else(case):
    rs, rd, e, dtype, m, count, ctas = CASES[case]
    src = _rows((rs, e), dtype, seed=1)
    if dtype.is_floating_point:
        src[0, :3] = torch.tensor([float("nan"), float("inf"), -0.0]).to(dtype)  # payloads survive
    perm = torch.randperm(rs, generator=torch.Generator().manual_seed(2))
    src_rows = perm[:m] if m <= rs else torch.randint(0, rs, (m,))
    src_rows[0] = 0
    dst_rows = torch.randperm(rd, generator=torch.Generator().manual_seed(3))[:m]
    dst = _rows((rd, e), dtype, seed=4)
    want = dst.clone()
    n = m if count is None else count
    count_t = None if count is None else torch.tensor([count], dtype=torch.int32)
    copy_rows_ref(src, want, src_rows, dst_rows, count_t)
    assert torch.equal(_bits(want[dst_rows[:n]]), _bits(src[src_rows[:n]]))
    got = dst.clone()
    copy_rows(src, got, src_rows, dst_rows, count_t, num_ctas=ctas, use_kernel=True)
    assert torch.equal(_bits(got), _bits(want))


def test_kernel_reads_the_count_from_memory():
    """The planner writes the task count on the device: rows past it stay untouched even when listed."""
    src = _rows((8, 64), torch.float32, seed=5)
    dst = torch.zeros(8, 64)
    rows = torch.arange(8)
    count = torch.tensor([3], dtype=torch.int32)
    copy_rows(src, dst, rows, rows.flip(0), count, num_ctas=2, use_kernel=True)
    assert torch.equal(dst[[7, 6, 5]], src[:3]) and not dst[:5].any()


def test_rows_may_live_in_views_of_larger_buffers():
    """The cache copies between a layer's slice of the slot buffer and the host store: offsets are respected."""
    big = _rows((10, 2, 16, 8), torch.float32, seed=6)
    src = big[4:].reshape(6, -1)
    dst = torch.zeros(3, 2 * 16 * 8)
    copy_rows(src, dst, torch.tensor([5, 0]), torch.tensor([1, 2]), num_ctas=1, use_kernel=True)
    assert torch.equal(dst[1], big[9].reshape(-1)) and torch.equal(dst[2], big[4].reshape(-1))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dst=torch.zeros(4, 9)), "row width"),
        (dict(dst=torch.zeros(4, 8, dtype=torch.float16)), "dtype"),
        (dict(src_rows=torch.tensor([0.0])), "src_rows must be an integer"),
        (dict(dst_rows=torch.tensor([0, 1])), "one shape"),
        (dict(count=torch.tensor([1, 2], dtype=torch.int32)), "one-element"),
        (dict(num_ctas=0), "num_ctas"),
        (dict(src=torch.zeros(4, 16)[:, ::2]), "contiguous rows"),
        (dict(src=torch.zeros(4)), "2-D"),
    ],
    ids=["width", "dtype", "float-index", "index-shapes", "count-shape", "ctas", "strided-rows", "1d-src"],
)
def test_bad_input_is_refused_with_the_argument_named(kwargs, match):
    args = dict(src=torch.zeros(4, 8), dst=torch.zeros(4, 8), src_rows=torch.tensor([0]), dst_rows=torch.tensor([1]),
                count=None, num_ctas=2)  # fmt: skip
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        copy_rows(**args, use_kernel=True)


@pytest.mark.gpu
def test_unpinned_host_memory_is_refused_for_a_gpu_copy():
    with pytest.raises(ValueError, match="pinned"):
        copy_rows(torch.zeros(4, 8), torch.zeros(4, 8, device="cuda"), torch.tensor([0], device="cuda"),
                  torch.tensor([1], device="cuda"))  # fmt: skip


@pytest.mark.parametrize("batch, ctas", [(1, 16), (31, 16), (32, 32), (128, 32)], ids=lambda x: str(x))
def test_default_cta_quota_is_the_papers_h100_rule(batch, ctas):
    assert default_cta_quota(batch) == ctas


def test_default_cta_quota_refuses_a_non_positive_batch():
    with pytest.raises(ValueError, match="batch_size"):
        default_cta_quota(0)
