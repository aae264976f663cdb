"""Tensor-parallel building blocks: linear layers split by output rows (column-parallel) or input columns
(row-parallel, one all-reduce), the vocabulary split across ranks (embedding and LM head), and :class:`Shard`, the
part of a checkpoint tensor a rank holds, which the loader reads and nothing else.

With one rank (``TensorParallel()``) every layer here computes exactly what ``nn.Linear`` / ``nn.Embedding`` do.
Parameter names stay ``weight`` / ``bias``, so checkpoints load by their Hugging Face names.

The vocabulary is split, not replicated: the embedding matrix and the LM head are the largest matrices of a
Qwen3.5-9B-sized model (248,320 × 4,096 each, 2 GiB in bf16), and the LM head is the largest matmul of a decode step;
split, each rank holds and computes ``1 / size`` of both. The price is one all-reduce of the embeddings per step and
one all-gather of the last tokens' logits (``[N, vocab]``: a few MiB at decode batch sizes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import TensorParallel
from .config import BaseConfig, HybridConfig


@dataclass(frozen=True)
class Shard:
    """The part of a checkpoint tensor one rank holds: the ``ranges`` ``[(start, stop), …]`` along ``dim`` of the
    checkpoint's tensor (``full`` long there), concatenated in order, then zero rows up to ``size`` (the padding of a
    vocabulary that does not split evenly)."""

    dim: int
    full: int
    ranges: tuple[tuple[int, int], ...]
    size: int

    def __post_init__(self):
        held = sum(stop - start for start, stop in self.ranges)
        if any(not 0 <= start <= stop <= self.full for start, stop in self.ranges) or held > self.size:
            raise ValueError(f"shard ranges {self.ranges} do not fit a dimension of {self.full} into {self.size} rows")

    @classmethod
    def blocks(cls, indices: range, width: int, count: int, dim: int = 0) -> Shard:
        """Blocks ``indices`` (heads, channels) of ``width`` rows each, out of ``count`` blocks along ``dim``."""
        return cls(dim, count * width, ((indices.start * width, indices.stop * width),), len(indices) * width)

    def full_shape(self, local: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint tensor's shape, given the shape of the part a rank holds."""
        shape = list(local)
        shape[self.dim] = self.full
        return tuple(shape)

    def read(self, source) -> torch.Tensor:
        """This rank's part of ``source`` — a tensor, or a safetensors slice (``safe_open(...).get_slice(name)``),
        from which only the ranges are read."""
        lead = (slice(None),) * self.dim
        parts = [source[(*lead, slice(start, stop))] for start, stop in self.ranges]
        held = sum(p.shape[self.dim] for p in parts)
        if held < self.size:
            pad = list(parts[0].shape)
            pad[self.dim] = self.size - held
            parts.append(parts[0].new_zeros(pad))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=self.dim)


class ColumnParallelLinear(nn.Linear):
    """``y = x Wᵀ + b`` for the output rows ``rows`` of the checkpoint's ``W`` (and ``b``): each rank computes its own
    outputs, no communication."""

    def __init__(self, in_features: int, rows: Shard, bias: bool = False):
        super().__init__(in_features, rows.size, bias=bias)
        self.checkpoint_shards = {"weight": rows} | ({"bias": rows} if bias else {})


class RowParallelLinear(nn.Linear):
    """``y = Σ_ranks x_r W_rᵀ + b``: this rank's input columns ``columns`` of the checkpoint's ``W`` (``dim`` 1) times
    its part of the input, summed over the ranks by one all-reduce; the bias (whole on every rank) is added once,
    after the sum."""

    def __init__(self, columns: Shard, out_features: int, bias: bool = False, *, parallel: TensorParallel):
        if columns.dim != 1:
            raise ValueError(f"a row-parallel layer splits its weight's dim 1 (input columns), got dim {columns.dim}")
        super().__init__(columns.size, out_features, bias=bias)
        self.parallel = parallel
        self.checkpoint_shards = {"weight": columns}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel.size == 1:
            return super().forward(x)
        y = self.parallel.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


def vocab_shard(vocab_size: int, parallel: TensorParallel) -> Shard:
    """Rows ``[rank · per_rank, (rank + 1) · per_rank)`` of a ``[vocab, hidden]`` matrix, ``per_rank = ⌈vocab /
    size⌉`` (the last ranks' tails padded with zero rows)."""
    per_rank = -(-vocab_size // parallel.size)
    start = min(parallel.rank * per_rank, vocab_size)
    return Shard(0, vocab_size, ((start, min(start + per_rank, vocab_size)),), per_rank)


class VocabParallelEmbedding(nn.Embedding):
    """Token embeddings with the vocabulary split across ranks: each rank looks up the ids in its range (others give
    zeros) and one all-reduce assembles every token's row."""

    def __init__(self, vocab_size: int, hidden_size: int, *, parallel: TensorParallel):
        shard = vocab_shard(vocab_size, parallel)
        super().__init__(shard.size, hidden_size)
        self.parallel = parallel
        self.vocab_start, self.vocab_stop = shard.ranges[0]
        self.checkpoint_shards = {"weight": shard}

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.size == 1:
            return super().forward(input_ids)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_stop)
        h = F.embedding(torch.where(mine, input_ids - self.vocab_start, 0), self.weight)
        return self.parallel.all_reduce(h * mine[..., None].to(h.dtype))


class ParallelLMHead(nn.Linear):
    """``logits = h Wᵀ`` with the vocabulary split across ranks: each rank computes its rows' logits and an
    all-gather assembles ``[..., vocab_size]`` on every rank (the padding rows cut off)."""

    def __init__(self, hidden_size: int, vocab_size: int, *, parallel: TensorParallel):
        shard = vocab_shard(vocab_size, parallel)
        super().__init__(hidden_size, shard.size, bias=False)
        self.parallel = parallel
        self.vocab_size = vocab_size
        self.checkpoint_shards = {"weight": shard}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().forward(hidden)
        if self.parallel.size == 1:
            return logits
        return self.parallel.all_gather(logits, dim=-1)[..., : self.vocab_size]


def parameter_shards(model: nn.Module) -> dict[str, Shard]:
    """``{parameter name: Shard}`` of every parameter of ``model`` that a rank holds only part of (the others are
    whole on every rank)."""
    shards = {}
    for prefix, module in model.named_modules():
        for name, shard in getattr(module, "checkpoint_shards", {}).items():
            shards[f"{prefix}.{name}" if prefix else name] = shard
    return shards


def rank_config(config: BaseConfig, parallel: TensorParallel) -> BaseConfig:
    """The geometry of what one rank's layers hold — its query heads, KV heads, FFN channels and GDN heads — as a
    config of the same kind (hidden size, vocabulary, layers and RoPE unchanged): what its caches are sized by."""
    if parallel.size == 1:
        return config
    changes = dict(
        num_attention_heads=len(parallel.partition(config.num_attention_heads, "num_attention_heads")),
        num_key_value_heads=len(parallel.partition_replicated(config.num_key_value_heads, "num_key_value_heads")),
        intermediate_size=len(parallel.partition(config.intermediate_size, "intermediate_size")),
    )
    if isinstance(config, HybridConfig):
        changes["linear_num_key_heads"] = len(parallel.partition(config.linear_num_key_heads, "linear_num_key_heads"))
        changes["linear_num_value_heads"] = len(
            parallel.partition(config.linear_num_value_heads, "linear_num_value_heads")
        )
    return dataclasses.replace(config, **changes)
