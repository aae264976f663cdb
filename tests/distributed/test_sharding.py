"""How a model splits across tensor-parallel ranks, in one process (building and loading a rank's part needs no
collective): which heads and channels each rank holds, the checkpoint parts it reads, and the errors for geometries
that do not split."""

import pytest
import torch

from longsparse.distributed import TensorParallel
from longsparse.models import ExecutionModes, load_model
from longsparse.models.parallel import Shard, parameter_shards, rank_config
from longsparse.models.registry import ARCHITECTURES
from tests.helpers import SMALL_BLOCK_SPARSE
from tests.tiny_models import build, save

NO_GROUP = object()
"""Stands in for a process group: building and loading a rank's part never communicates."""


def rank(r: int, size: int) -> TensorParallel:
    return TensorParallel(r, size, NO_GROUP)


def test_heads_split_into_equal_ranges_and_kv_heads_are_replicated_when_fewer_than_ranks():
    assert [rank(r, 3).partition(9, "heads") for r in range(3)] == [range(0, 3), range(3, 6), range(6, 9)]
    assert [rank(r, 3).partition_replicated(3, "kv") for r in range(3)] == [range(0, 1), range(1, 2), range(2, 3)]
    assert [rank(r, 4).partition_replicated(2, "kv") for r in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    assert [rank(r, 2).partition_replicated(4, "kv") for r in range(2)] == [range(0, 2), range(2, 4)]
    with pytest.raises(ValueError, match="num_attention_heads=9 is not divisible by tensor_parallel_size=2"):
        rank(0, 2).partition(9, "num_attention_heads")
    with pytest.raises(ValueError, match="num_key_value_heads=2 is fewer than tensor_parallel_size=3"):
        rank(0, 3).partition_replicated(2, "num_key_value_heads")


def test_a_group_of_several_ranks_needs_a_process_group_and_a_rank_inside_it():
    with pytest.raises(ValueError, match="needs a torch.distributed process group"):
        TensorParallel(0, 2)
    with pytest.raises(ValueError, match=r"rank must lie in \[0, 2\), got 2"):
        TensorParallel(2, 2, NO_GROUP)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        TensorParallel(0, 0)


def test_a_shard_reads_its_ranges_in_order_and_pads_to_its_size():
    full = torch.arange(40.0).view(10, 4)
    shard = Shard(0, 10, ((1, 3), (8, 10)), 5)
    part = shard.read(full)
    assert torch.equal(part[:4], full[[1, 2, 8, 9]]) and torch.equal(part[4], torch.zeros(4))
    columns = Shard.blocks(range(1, 2), 2, 2, dim=1)
    assert torch.equal(columns.read(full), full[:, 2:4])
    assert shard.full_shape((5, 4)) == (10, 4) and columns.full_shape((10, 2)) == (10, 4)
    with pytest.raises(ValueError, match="do not fit"):
        Shard(0, 10, ((8, 12),), 4)


def test_rank_config_holds_a_ranks_share_of_the_heads():
    hybrid = build("qwen35", seed=0, linear_num_key_heads=4, linear_num_value_heads=8)
    config = ARCHITECTURES["Qwen3_5ForCausalLM"].config_from_hf(hybrid.config.to_dict())
    local = rank_config(config, rank(1, 2))
    assert (local.num_attention_heads, local.num_key_value_heads, local.intermediate_size) == (2, 1, 48)
    assert (local.linear_num_key_heads, local.linear_num_value_heads) == (2, 4)
    assert (local.hidden_size, local.vocab_size, local.num_hidden_layers) == (64, 101, 4)
    assert rank_config(config, TensorParallel()) is config
    with pytest.raises(ValueError, match="num_attention_heads=4 is not divisible by tensor_parallel_size=3"):
        rank_config(config, rank(0, 3))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Qwen3.5 hybrid with 2 KV heads (split on 2 ranks, replicated on 4) and the single-process model."""
    hybrid = build("qwen35", seed=3, linear_num_key_heads=4, linear_num_value_heads=8)
    path = save(hybrid, tmp_path_factory.mktemp("qwen35"))
    return path, load_model(path).model


@pytest.mark.parametrize("size", [2, 4], ids=["2-ranks", "4-ranks-kv-replicated"])
def test_each_rank_holds_its_part_of_every_parameter(checkpoint, size):
    """Every parameter of a rank is the part its shard names of the whole model's (the rest whole), and the ranks'
    parts of a split parameter cover it once — twice for KV heads replicated on two ranks each."""
    path, whole = checkpoint
    parts = [load_model(path, parallel=rank(r, size)).model for r in range(size)]
    shards = [parameter_shards(p) for p in parts]
    for name, param in whole.named_parameters(remove_duplicate=False):
        pieces = [dict(p.named_parameters(remove_duplicate=False))[name] for p in parts]
        if name not in shards[0]:
            assert all(torch.equal(piece, param) for piece in pieces), name
            continue
        for piece, shard in zip(pieces, (s[name] for s in shards)):
            assert torch.equal(piece, shard.read(param.detach())), name
        held = sum(sum(stop - start for start, stop in s[name].ranges) for s in shards)
        copies = 2 if size == 4 and ("k_proj" in name or "v_proj" in name) else 1
        assert held == copies * param.shape[shards[0][name].dim], name


def test_kv_heads_replicated_on_ranks_that_share_them(tmp_path):
    path = save(build("qwen35", seed=4, num_key_value_heads=1), tmp_path)
    whole = load_model(path).model
    parts = [load_model(path, parallel=rank(r, 2)).model for r in range(2)]
    k_proj = "model.layers.1.self_attn.k_proj.weight"
    for part in parts:
        assert part.rank_config.num_key_value_heads == 1
        assert torch.equal(dict(part.named_parameters())[k_proj], dict(whole.named_parameters())[k_proj])
    q_proj = "model.layers.1.self_attn.q_proj.weight"
    halves = [dict(p.named_parameters())[q_proj] for p in parts]
    assert torch.equal(torch.cat(halves), dict(whole.named_parameters())[q_proj])


def test_sparse_attention_refuses_a_gqa_group_split_across_ranks(tmp_path):
    path = save(build("qwen35", seed=4, num_key_value_heads=1), tmp_path)
    model = load_model(path, parallel=rank(0, 2)).model
    with pytest.raises(ValueError, match="'sparse' with tensor_parallel_size=2 > num_key_value_heads=1"):
        model.set_modes(ExecutionModes(attention="sparse"), sparse_attention_config=SMALL_BLOCK_SPARSE)
    model.set_modes(ExecutionModes(attention="dense"))
