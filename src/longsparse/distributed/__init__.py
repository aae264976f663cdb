"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on the CPU): the group a model is built for, its
collectives and how heads split across its ranks (:mod:`.group`), and the worker processes that hold the ranks for a
driver process (:mod:`.workers`)."""

from .group import TensorParallel, raised_on_every_rank
from .workers import RankFailure, Workers

__all__ = ["RankFailure", "TensorParallel", "Workers", "raised_on_every_rank"]
