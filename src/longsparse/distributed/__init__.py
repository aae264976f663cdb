"""Tensor parallelism on torch.distributed (NCCL on GPUs, gloo on the CPU): the group a model is built for, its
collectives and how heads split across its ranks (:mod:`.group`)."""

from .group import TensorParallel

__all__ = ["TensorParallel"]
