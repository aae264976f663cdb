"""One rank's place in a tensor-parallel group, passed to a model when it is built (no module-global state).

Sharding follows Megatron-LM and vLLM: a layer's heads (attention query heads, GDN q/k and v heads) and the FFN's
intermediate channels are split into equal contiguous ranges, one per rank; KV heads are split the same way when
there are at least as many as ranks, and otherwise each KV head is replicated on ``size / num_kv_heads`` consecutive
ranks, so that every rank holds the KV head its query heads read.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    """Rank ``rank`` of a tensor-parallel group of ``size`` ranks; ``group`` is its torch.distributed process group
    (None for a single rank, where every collective is the identity), ``control`` a gloo group over the same ranks
    for Python objects (errors, counts: host memory, as vLLM's CPU group; ``group`` itself under gloo).

    The collectives act on the whole group and must be called by every rank in the same order.
    """

    rank: int = 0
    size: int = 1
    group: Any = None
    control: Any = None

    def __post_init__(self):
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"tensor-parallel size must be a positive integer, got {self.size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank must lie in [0, {self.size}), got {self.rank!r}")
        if self.size > 1 and self.group is None:
            raise ValueError(f"a tensor-parallel group of {self.size} ranks needs a torch.distributed process group")

    @classmethod
    def initialize(
        cls,
        rank: int,
        size: int,
        init_method: str,
        device: torch.device | str = "cpu",
        *,
        backend: str | None = None,
        timeout: timedelta | None = None,
    ) -> TensorParallel:
        """Join the default process group as ``rank`` of ``size`` (``init_method``: torch.distributed's, e.g.
        ``tcp://127.0.0.1:29500`` or ``file:///tmp/rendezvous``). ``backend``: default NCCL for a CUDA ``device``,
        gloo otherwise; ``timeout``: how long a collective waits for the other ranks (torch's default if None). A
        single rank (``size == 1``) creates no group."""
        if size == 1:
            return cls()
        device = torch.device(device)
        backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        options: dict[str, Any] = {}
        if device.type == "cuda":
            options["device_id"] = device
        if timeout is not None:
            options["timeout"] = timeout
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size, **options)
        control = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
        return cls(rank, size, dist.group.WORLD, control)

    def close(self) -> None:
        """Leave the process group (after the last collective)."""
        if self.group is not None and dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        """Wait until every rank has come here."""
        if self.size > 1:
            dist.barrier(group=self.group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks, in place (``x`` itself with one rank)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order (every rank's ``x`` has the same shape)."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``x`` on every rank, in place (``x`` itself with one rank)."""
        if self.size > 1:
            dist.broadcast(x, src, group=self.group)
        return x

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def agree(self, error: Exception | None) -> None:
        """Every rank calls this at the same point with the error it met since the last collective (None if none).
        Unless every rank passes None, every rank raises the error of the first rank that met one — so that a
        failure on one rank (a request too large for its memory, say) does not leave the others waiting in the next
        collective. The raised error is marked (:func:`raised_on_every_rank`), so that a caller can tell that the
        group is still in step."""
        if self.size == 1:
            if error is not None:
                raise error
            return
        errors = self.gather_objects(_picklable(error))
        first = next((rank for rank, e in enumerate(errors) if e is not None), None)
        if first is None:
            return
        raised = error if first == self.rank else errors[first]
        raised.raised_on_every_rank = True
        raise raised

    def partition(self, total: int, what: str) -> range:
        """This rank's equal contiguous share of ``total`` heads or channels (``what`` names them in the error when
        ``total`` does not divide evenly)."""
        if total % self.size:
            raise ValueError(f"{what}={total} is not divisible by tensor_parallel_size={self.size}")
        share = total // self.size
        return range(self.rank * share, (self.rank + 1) * share)

    def partition_replicated(self, total: int, what: str) -> range:
        """KV heads: :meth:`partition` when ``total >= size``; otherwise the one head this rank holds, each head
        replicated on ``size / total`` consecutive ranks (``size`` must then be a multiple of ``total``)."""
        if total >= self.size:
            return self.partition(total, what)
        if self.size % total:
            raise ValueError(
                f"{what}={total} is fewer than tensor_parallel_size={self.size} and does not divide it: each KV head "
                "must be replicated on the same number of ranks"
            )
        head = self.rank // (self.size // total)
        return range(head, head + 1)


def raised_on_every_rank(error: BaseException) -> bool:
    """Whether ``error`` came out of :meth:`TensorParallel.agree`: every rank of the group raised it at the same
    point, and the group is still in step."""
    return getattr(error, "raised_on_every_rank", False) is True


def _picklable(error: Exception | None) -> Exception | None:
    """``error``, or a RuntimeError with its type and message where it does not pickle (it is sent to the others)."""
    if error is None:
        return None
    try:
        pickle.dumps(error)
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
