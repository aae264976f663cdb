"""Where the block cache's device work runs: a ``compute`` queue (the caller's current CUDA stream) and a ``transfer``
queue (the prefetch stream), ordered only by named events — CUDA's stream semantics, behind a small interface.

* :class:`CudaStreams` — the real thing: work enqueued under ``torch.cuda.stream``, ``cudaEventRecord`` /
  ``cudaStreamWaitEvent`` through reusable named ``torch.cuda.Event`` objects.
* :class:`InlineStreams` — CPU: every piece of work runs when it is enqueued, so any order the events allow is the
  program order and the events are no-ops.

The semantics an implementation must keep (and the simulation in ``tests/cache/stream_sim.py`` checks the cache
against): work on one queue runs in enqueue order; ``wait(q, e)`` holds everything enqueued on ``q`` after it until
the work enqueued before the *latest* ``record(·, e)`` (at the time of the wait) has run; waiting on an event never
recorded is a no-op.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

COMPUTE = "compute"
TRANSFER = "transfer"
QUEUES = (COMPUTE, TRANSFER)


def _check_queue(queue: str) -> None:
    if queue not in QUEUES:
        raise ValueError(f"queue must be one of {QUEUES}, got {queue!r}")


class Streams(ABC):
    """Two queues of device work and named events between them (see the module docstring)."""

    @abstractmethod
    def run(self, queue: str, work: Callable[[], None]) -> None:
        """Enqueue ``work`` (a function that launches device work) on ``queue``."""

    @abstractmethod
    def record(self, queue: str, event: str) -> None:
        """Record ``event`` on ``queue`` (re-recording moves it: later waits see the new record)."""

    @abstractmethod
    def wait(self, queue: str, event: str) -> None:
        """Make later work on ``queue`` wait for the latest record of ``event``."""

    @abstractmethod
    def hold(self, tensor: torch.Tensor, queue: str) -> None:
        """Keep ``tensor``'s memory from being reused until the work enqueued so far on ``queue`` has run."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block the host until all enqueued work has run."""

    @abstractmethod
    def forget_events(self) -> None:
        """Treat every event as never recorded. Around a CUDA-graph capture: waits on records made outside the
        capture cannot be captured (graph replays on one stream are ordered anyway), and events recorded inside it
        must not be reused outside."""


class InlineStreams(Streams):
    """Run every piece of work at once (CPU, or a GPU without overlap): events are no-ops."""

    def run(self, queue, work):
        _check_queue(queue)
        work()

    def record(self, queue, event):
        _check_queue(queue)

    def wait(self, queue, event):
        _check_queue(queue)

    def hold(self, tensor, queue):
        _check_queue(queue)

    def synchronize(self):
        return

    def forget_events(self):
        return


class CudaStreams(Streams):
    """``compute`` is the current stream of ``device`` at each call; ``transfer`` is one stream made here, at high
    priority so that the persistent copy kernel's programs start as soon as multiprocessors free up."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaStreams needs a CUDA device, got {self.device}")
        self.transfer = torch.cuda.Stream(self.device, priority=-1)
        self._events: dict[str, torch.cuda.Event] = {}

    def _stream(self, queue: str) -> torch.cuda.Stream:
        _check_queue(queue)
        return self.transfer if queue == TRANSFER else torch.cuda.current_stream(self.device)

    def run(self, queue, work):
        with torch.cuda.stream(self._stream(queue)):
            work()

    def record(self, queue, event):
        ev = self._events.get(event)
        if ev is None:
            ev = self._events[event] = torch.cuda.Event()
        ev.record(self._stream(queue))

    def wait(self, queue, event):
        ev = self._events.get(event)
        if ev is not None:
            self._stream(queue).wait_event(ev)

    def hold(self, tensor, queue):
        if tensor.device.type == "cuda":
            tensor.record_stream(self._stream(queue))

    def synchronize(self):
        torch.cuda.synchronize(self.device)

    def forget_events(self):
        self._events.clear()


def streams_for(device: torch.device | str, overlap: bool) -> Streams:
    """:class:`CudaStreams` on a CUDA device when ``overlap`` is wanted, else :class:`InlineStreams`."""
    device = torch.device(device)
    return CudaStreams(device) if overlap and device.type == "cuda" else InlineStreams()
