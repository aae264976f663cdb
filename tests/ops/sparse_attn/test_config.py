"""SparseAttentionConfig: MiniCPM4.1's values by default, derived sizes, and clear errors for bad geometry."""

import pytest

from longsparse.ops.sparse_attn import MINICPM4, SparseAttentionConfig


def test_defaults_are_minicpm4():
    c = SparseAttentionConfig()
    assert c == MINICPM4
    assert (c.block_size, c.init_blocks, c.window, c.topk, c.kernel_size, c.kernel_stride, c.dense_len) == (
        64, 1, 2048, 64, 32, 16, 8192,
    )  # fmt: skip
    assert c.local_blocks == 32
    assert c.budget_blocks == 96  # the overall budget of SparDA (Fu et al., arXiv:2606.04511), App. C
    assert (c.pool_kernel, c.pool_stride, c.pool_overlap) == (5, 4, 1)  # InfLLM-V2 max_pooling_1d: 5 / 4 / pad 1
    assert c.decode_width() == 128  # every block of a sequence below dense_len = 8192 tokens
    assert c.num_compressed(31) == 0 and c.num_compressed(32) == 1 and c.num_compressed(131072) == 8191
    assert c.num_blocks(131072) == 2048 and c.num_blocks(65) == 2
    assert (c.neighbour_blocks, c.group_reduce, c.pool_reach) == (0, "sum", 1) and c.default_rules
    assert SparseAttentionConfig(neighbour_blocks=2).pool_reach == 9


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_size": 48}, "power of two"),
        ({"block_size": 8, "kernel_size": 8, "kernel_stride": 4, "window": 8}, "power of two >= 16"),
        ({"window": 100}, "multiple of block_size"),
        ({"kernel_stride": 24}, "must divide block_size"),
        ({"kernel_size": 40}, "multiple of kernel_stride"),
        ({"kernel_size": 96}, "may exceed block_size"),
        ({"topk": 1}, "at least init_blocks"),
        ({"dense_len": -1}, "dense_len"),
        ({"init_blocks": 2.0}, "init_blocks"),
        ({"block_size": 0}, "block_size"),
        ({"neighbour_blocks": -1}, "neighbour_blocks"),
        ({"group_reduce": "mean"}, "group_reduce"),
    ],
    ids=lambda x: x if isinstance(x, str) else "-".join(f"{k}{v}" for k, v in x.items()),
)
def test_bad_geometry_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SparseAttentionConfig(**kwargs)
