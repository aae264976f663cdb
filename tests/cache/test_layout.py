"""Row numbering of the block layout: every block has exactly one host row and one GPU row per place it can be, in
range, and the layout's byte counts are what the rows and buffers take."""

import pytest
import torch

from longsparse.cache import BlockLayout
from longsparse.ops.sparse_attn import MINICPM4, SparseAttentionConfig

CFG = SparseAttentionConfig(block_size=16, init_blocks=2, window=32, topk=6, kernel_size=16, kernel_stride=8,
                            dense_len=64)  # fmt: skip


def test_host_rows_are_distinct_and_cover_the_store():
    lay = BlockLayout(CFG, (1, 3, 4), (3, 4), 3, 100, 2, 8, torch.bfloat16)
    rows = [lay.host_row(layer, s, h, b) for layer in lay.offloaded for s in range(3) for h in range(2)
            for b in range(lay.blocks_per_seq)]  # fmt: skip
    assert sorted(rows) == list(range(lay.host_rows))
    # sequence-major: one sequence's blocks are one contiguous range
    blocks = range(lay.blocks_per_seq)
    seq1 = [lay.host_row(layer, 1, h, b) for layer in lay.offloaded for h in range(2) for b in blocks]
    assert sorted(seq1) == list(range(min(seq1), min(seq1) + len(seq1)))


def test_gpu_slot_rows_of_all_offloaded_layers_tile_the_slot_buffer():
    lay = BlockLayout(CFG, (1, 3, 4), (3, 4), 3, 100, 2, 8, torch.bfloat16)
    rows = []
    for layer in lay.offloaded:
        m = lay.slot_map(layer)
        rows += [m.gpu_offset + (s * 2 + h) * m.slots_per_row + j for s in range(3) for h in range(2)
                 for j in range(m.slots_per_row)]  # fmt: skip
    assert sorted(rows) == list(range(lay.slot_rows))


def test_minicpm_geometry_at_128k():
    lay = BlockLayout(MINICPM4, tuple(range(32)), tuple(range(1, 32)), 1, 131072, 2, 128, torch.bfloat16)
    assert lay.row_bytes == 32 * 1024 and lay.blocks_per_seq == 2048
    assert (lay.forced_slots, lay.dynamic_slots) == (34, 94)
    assert lay.host_bytes() == 31 * 2 * 2048 * 32 * 1024  # 3.875 GiB of host memory per sequence
    # GPU: layer 0 whole (128 MiB), 31 x 2 x 128 slots (248 MiB) and ~0.14 MiB of plans and counters; the compressed
    # keys of the 32 layers (~128 MiB more) are not the layout's (CompressedKeys, counted by the capacity model)
    assert 376 * 2**20 < lay.gpu_bytes() < 376.5 * 2**20


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(layers=(3, 1)), "ascending"),
        (dict(offloaded=(2,)), "subset"),
        (dict(num_seqs=0), "num_seqs"),
        (dict(dtype=torch.int32), "floating"),
        (dict(config="minicpm"), "SparseAttentionConfig"),
    ],
    ids=["unsorted-layers", "offloaded-not-a-layer", "no-seqs", "int-dtype", "config-type"],
)
def test_bad_layouts_are_refused(kwargs, match):
    args = dict(config=CFG, layers=(1, 3), offloaded=(3,), num_seqs=1, capacity=64, num_kv_heads=2, head_dim=8,
                dtype=torch.float32)  # fmt: skip
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BlockLayout(**args)


def test_slot_map_of_a_resident_layer_is_refused():
    lay = BlockLayout(CFG, (1, 3), (3,), 1, 64, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="not offloaded"):
        lay.slot_map(1)
