"""What the worker-failure tests run on each rank: an object whose methods fail on one rank while the others wait for
it in a collective, and a way to make a tensor-parallel ``LLM``'s rank fail its next prefill."""

from __future__ import annotations

import os
import signal

import torch

from longsparse.distributed import TensorParallel


class Ranks:
    """Built on every worker by :class:`~longsparse.distributed.workers.Workers` (``build(parallel=…)``)."""

    def __init__(self, *, parallel: TensorParallel):
        self.parallel = parallel

    def worker_info(self) -> int:
        return self.parallel.size

    def total(self, x: float) -> float:
        """``x`` summed over the ranks (an all-reduce)."""
        return float(self.parallel.all_reduce(torch.tensor([x]))[0])

    def fail(self, rank: int, how: str) -> None:
        """Rank ``rank`` raises (``how="raise"``) or is killed (``"die"``) while the others wait for it."""
        if self.parallel.rank == rank:
            if how == "raise":
                raise ValueError(f"rank {rank} cannot go on")
            os.kill(os.getpid(), signal.SIGKILL)
        self.parallel.barrier()

    def refuse_on(self, rank: int) -> None:
        """Rank ``rank`` refuses before any collective; every rank raises its error (TensorParallel.agree)."""
        error = ValueError(f"rank {rank} refuses this request") if self.parallel.rank == rank else None
        self.parallel.agree(error)


def break_prefill(llm, rank: int) -> None:
    """Through ``LLM.collective_rpc``: the next prefill on rank ``rank`` raises (the others go on into its first
    collective and wait there)."""
    if llm.parallel.rank == rank:

        def prefill(*args, **kwargs):
            raise RuntimeError(f"rank {rank} lost its device")

        llm.runner.prefill = prefill
