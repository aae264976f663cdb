"""``AsyncLLMEngine``: an :class:`~longsparse.engine.llm_engine.LLMEngine` stepped in a thread of its own, with an
asyncio interface for the server.

The event loop never waits for a model step: :meth:`AsyncLLMEngine.generate` queues its request as a command, the
engine thread adds it between two steps and sends each step's outputs back to the request's asyncio queue. A
generator that is closed before its request finished (the client went away) queues an abort, which frees the slot
before the next step. A request that can never run, or that finds the queue full, fails in ``generate`` before it
yields anything (ValueError / :class:`~longsparse.engine.scheduler.QueueFull`). If a step raises, every request in
flight fails with that error and the engine goes on with the next ones — unless the engine cannot go on (a
tensor-parallel rank failed, and the workers have ended): the engine thread then stops, and every later request
fails with :class:`EngineDeadError`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from collections.abc import Sequence as SequenceABC
from typing import Any

from .llm_engine import LLMEngine, RequestOutput
from .sampler import SamplingParams
from .scheduler import QueueFull

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread has stopped: no request can run."""


class AsyncLLMEngine:
    """``engine`` stepped by a daemon thread started by :meth:`start` (or on the first :meth:`generate`)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[str, tuple[Any, ...]]] = queue.SimpleQueue()
        self._sinks: dict[str, Callable[[RequestOutput | BaseException], None]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._in_flight: set[str] = set()
        self._ended = False
        self._end_lock = threading.Lock()  # a request is queued before the thread ends, or refused after
        self.error: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="longsparse-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the engine thread after its current step (requests in flight are left unanswered)."""
        self._stopping.set()
        self._commands.put(("wake", ()))
        if self._thread is not None:
            self._thread.join(timeout)

    def check(self, prompt_ids: SequenceABC[int], params: SamplingParams) -> None:
        """Raise now what :meth:`generate` would fail with at once: ValueError for a request that can never run,
        :class:`~longsparse.engine.scheduler.QueueFull` when every slot is taken and the queue is full."""
        self.engine.scheduler.check(len(prompt_ids), params.max_new_tokens)
        config = self.engine.config
        if len(self._in_flight) >= config.max_num_seqs + config.max_queued_requests:
            raise QueueFull(
                f"all {config.max_num_seqs} slots are taken and {config.max_queued_requests} requests wait "
                f"(max_queued_requests); try again later"
            )

    async def generate(
        self,
        prompt_ids: SequenceABC[int],
        params: SamplingParams,
        request_id: str,
        *,
        ignore_eos: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """The outputs of one request, step by step, the last one with its ``finish_reason``. Closing the iterator
        before that aborts the request. Errors: those of :meth:`check` and of
        :meth:`~longsparse.engine.llm_engine.LLMEngine.add_request`, raised by the first iteration;
        :class:`EngineDeadError` once the engine thread has stopped."""
        self.start()
        if not self.alive:
            raise EngineDeadError(f"the engine thread has stopped: {self.error!r}")
        self.check(prompt_ids, params)
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def sink(item: RequestOutput | BaseException) -> None:
            loop.call_soon_threadsafe(outputs.put_nowait, item)

        with self._end_lock:
            if self._ended:
                raise EngineDeadError(f"the engine thread has stopped: {self.error!r}")
            self._in_flight.add(request_id)
            self._commands.put(("add", (request_id, list(prompt_ids), params, ignore_eos, sink)))
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            self._in_flight.discard(request_id)
            if not finished:
                self._commands.put(("abort", (request_id,)))

    def _loop(self) -> None:
        engine = self.engine
        try:
            while not self._stopping.is_set():
                self._run_commands(block=not engine.has_unfinished_requests())
                if self._stopping.is_set():
                    break
                if not engine.has_unfinished_requests():
                    continue
                try:
                    outputs = engine.step()
                except Exception as exc:  # noqa: BLE001 - the requests in flight get the error, the server goes on
                    logger.exception("engine step failed; failing the requests in flight")
                    self._fail_all(exc)
                    if not engine.alive:
                        self.error = exc
                        self._end(EngineDeadError(f"the engine cannot go on: {exc}"))
                        return
                    continue
                for out in outputs:
                    sink = self._sinks.get(out.request_id)
                    if sink is not None:
                        sink(out)
                    if out.finished:
                        self._sinks.pop(out.request_id, None)
        except BaseException as exc:
            self.error = exc
            self._fail_all(EngineDeadError(f"the engine thread stopped: {exc!r}"))
            self._end(EngineDeadError(f"the engine thread stopped: {exc!r}"))
            raise

    def _end(self, error: EngineDeadError) -> None:
        """Refuse every request from now on, and fail those queued but not yet added with ``error``."""
        with self._end_lock:
            self._ended = True
        while True:
            try:
                kind, args = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                args[-1](error)

    def _run_commands(self, block: bool) -> None:
        """Carry out the queued commands (waiting for the first one if ``block``)."""
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return
        while True:
            kind, args = command
            if kind == "add":
                self._add(*args)
            elif kind == "abort":
                (request_id,) = args
                self._sinks.pop(request_id, None)
                self.engine.abort_request(request_id)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, request_id, prompt_ids, params, ignore_eos, sink) -> None:
        try:
            self.engine.add_request(prompt_ids, params, request_id=request_id, ignore_eos=ignore_eos)
        except Exception as exc:  # noqa: BLE001 - handed to the request's caller
            sink(exc)
            return
        self._sinks[request_id] = sink

    def _fail_all(self, error: BaseException) -> None:
        for request_id, sink in list(self._sinks.items()):
            sink(error)
            self.engine.abort_request(request_id)
        self._sinks.clear()
