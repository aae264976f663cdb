"""Tensor-parallel worker processes, driven as vLLM drives its workers: the driver (the user's process) sends each call
to every rank, every rank makes it on its own part of the model (their collectives keep them in step), and rank 0
sends the result back.

``Workers(size, build, kwargs)`` starts ``size`` processes (``spawn``), one per GPU with NCCL (``cuda:0 …``) or gloo
processes on a CPU. Each joins the group (:meth:`~longsparse.distributed.TensorParallel.initialize`) and builds its
object, ``build(parallel=its TensorParallel, **kwargs)`` (``LLM`` for ``LLM(tensor_parallel_size=N)``).
:meth:`Workers.call` then runs a method of it on every rank (rank 0's result), :meth:`Workers.collective` a function of
it (every rank's result).

Failures. An error that every rank raised at the same point
(:func:`~longsparse.distributed.raised_on_every_rank`: a request refused before its first collective) is raised on
the driver and the workers go on. Any other error, and the death of a rank, ends every worker (the others may be
waiting for it in a collective) and raises :class:`RankFailure` with that rank's error and traceback on the driver;
the workers are then gone. A worker whose driver dies exits by itself.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

import torch
import torch.multiprocessing as mp

from .group import TensorParallel, raised_on_every_rank

STOP_GRACE_S = 5.0
"""How long an ending worker has after SIGTERM before it is killed."""
FAILURE_WINDOW_S = 2.0
"""After a first failure, how long the driver waits for the other ranks' reports to tell the cause (a rank that died,
or the earliest error) from its consequences (the others' collectives failing against it)."""
PARENT_POLL_S = 1.0


class RankFailure(RuntimeError):
    """A tensor-parallel rank failed: it raised (its exception is the ``__cause__`` where it could be sent) or died.
    Every worker has been ended."""

    def __init__(self, rank: int, message: str):
        super().__init__(message)
        self.rank = rank


class Workers:
    """``size`` worker processes, each holding ``build(parallel=…, **kwargs)``; see the module docstring.

    ``device``: ``"cuda"`` (rank r on ``cuda:r``, NCCL) or ``"cpu"`` (gloo). ``threads``: torch CPU threads of each
    worker (default: this process's, shared out among the ranks). ``timeout_s``: how long a collective waits for the
    other ranks (torch's default when None; the driver ends the workers at once when one of them fails anyway).
    """

    def __init__(
        self,
        size: int,
        build: Callable[..., Any],
        kwargs: dict[str, Any],
        *,
        device: str = "cpu",
        threads: int | None = None,
        timeout_s: float | None = None,
    ):
        if not isinstance(size, int) or size < 2:
            raise ValueError(f"Workers needs at least 2 ranks, got {size!r}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"the workers' device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and size > torch.cuda.device_count():
            raise ValueError(
                f"tensor_parallel_size={size} needs {size} GPUs (one per rank); this machine has "
                f"{torch.cuda.device_count()}"
            )
        self.size = size
        self._failure: str | None = None
        threads = threads or max(1, torch.get_num_threads() // size)
        self._rendezvous = tempfile.mkdtemp(prefix="longsparse-tp-")
        context = mp.get_context("spawn")
        self._conns, self._processes = [], []
        for rank in range(size):
            ours, theirs = context.Pipe()
            store = f"file://{self._rendezvous}/store"
            args = (rank, size, store, device, threads, timeout_s, build, kwargs, theirs, os.getpid())
            process = context.Process(target=_worker_main, args=args, name=f"longsparse-tp-rank{rank}", daemon=True)
            process.start()
            theirs.close()
            self._conns.append(ours)
            self._processes.append(process)
        self._finalizer = weakref.finalize(self, _end, self._processes, self._conns, self._rendezvous)
        self.info = self._receive(range(1))[0]

    @property
    def alive(self) -> bool:
        return self._failure is None and self._finalizer.alive

    def call(self, method: str, *args, **kwargs) -> Any:
        """``method(*args, **kwargs)`` of the object on every rank; rank 0's result."""
        return self._send(method, args, kwargs, False)[0]

    def collective(self, fn: Callable[..., Any], *args, **kwargs) -> list[Any]:
        """``fn(object, *args, **kwargs)`` on every rank (``fn`` importable by name, e.g. a module's function);
        every rank's result, in rank order (vLLM's ``collective_rpc``)."""
        return self._send(fn, args, kwargs, True)

    def _send(self, method, args, kwargs, every: bool) -> list[Any]:
        if self._failure is not None:
            raise RuntimeError(f"the tensor-parallel workers have ended: {self._failure}")
        if not self._finalizer.alive:
            raise RuntimeError("the tensor-parallel workers have been closed")
        command = ("call", method, args, kwargs, every)
        for conn in self._conns:
            try:
                conn.send(command)
            except OSError:
                break  # that rank has exited: _receive reports it
        return self._receive(range(self.size) if every else range(1))

    def close(self) -> None:
        """Tell the workers to leave the group and exit; end those that do not within :data:`STOP_GRACE_S`."""
        if not self._finalizer.alive:
            return
        if self._failure is None:
            for conn in self._conns:
                try:
                    conn.send(("stop",))
                except OSError:
                    pass
            deadline = time.monotonic() + STOP_GRACE_S
            for process in self._processes:
                process.join(max(0.0, deadline - time.monotonic()))
        self._finalizer()

    def _receive(self, ranks: range) -> list[Any]:
        """Wait for the answers of ``ranks`` while watching every rank for an error or its death; their results, or
        the error every rank raised."""
        answers: dict[int, tuple] = {}
        while len(answers) < len(ranks):
            ready = connection.wait([*self._conns, *(p.sentinel for p in self._processes)])
            failures: dict[int, tuple[float, str, bytes | None]] = {}
            for rank, conn in enumerate(self._conns):
                message = _read(conn) if conn in ready else None
                if message is None:
                    continue
                kind = message[0]
                if kind in ("result", "raised"):
                    answers[rank] = message
                elif kind == "failed":
                    failures[rank] = message[1:]
            if failures or any(p.sentinel in ready for p in self._processes):
                self._fail(failures)
        for kind, value in (answers[rank] for rank in ranks):
            if kind == "raised":  # every rank raised it before a collective: the group is still in step
                raise value
        return [answers[rank][1] for rank in ranks]

    def _fail(self, failures: dict[int, tuple[float, str, bytes | None]]) -> None:
        """Gather the ranks' failures for up to :data:`FAILURE_WINDOW_S`, end every worker and raise
        :class:`RankFailure` for the cause: a rank that died without a word, else the earliest error."""
        deadline = time.monotonic() + FAILURE_WINDOW_S
        pending, silent = set(range(self.size)) - set(failures), []
        while pending and (left := deadline - time.monotonic()) > 0:
            ready = connection.wait([self._conns[r] for r in pending], left)
            if not ready:
                break  # the ranks still pending wait in a collective
            for rank in sorted(pending):
                if self._conns[rank] not in ready:
                    continue
                message = _read(self._conns[rank])
                if message is None:  # exited without a word
                    silent.append(rank)
                elif message[0] == "failed":
                    failures[rank] = message[1:]
                else:
                    continue
                pending.discard(rank)
        if silent:
            rank, error = silent[0], None
            self._processes[rank].join()
            code = self._processes[rank].exitcode
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            message = f"tensor-parallel rank {rank} {how}"
        else:
            rank = min(failures, key=lambda r: failures[r][0])
            _, message, error = failures[rank]
        self._failure = message.splitlines()[0]
        self._finalizer()
        cause = None
        if error is not None:
            try:
                cause = pickle.loads(error)
            except Exception:  # noqa: BLE001 - an exception class the driver cannot rebuild
                cause = None
        raise RankFailure(rank, message) from cause


def _read(conn) -> tuple | None:
    """The next message on ``conn``, None once its worker has exited."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _end(processes, conns, rendezvous: str) -> None:
    """End every worker still running (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`) and clean up."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    for conn in conns:
        conn.close()
    shutil.rmtree(rendezvous, ignore_errors=True)


def _exit_with(parent: int) -> None:
    """Exit this process when ``parent`` (the driver) is gone, even if it was killed without ending its workers."""

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_main(rank, size, init_method, device, threads, timeout_s, build, kwargs, conn, parent) -> None:
    _exit_with(parent)
    torch.set_num_threads(threads)
    try:
        if device == "cuda":
            torch.cuda.set_device(rank)
        from datetime import timedelta

        timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
        target = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
        parallel = TensorParallel.initialize(rank, size, init_method, target, timeout=timeout)
        obj = build(parallel=parallel, **kwargs)
        if rank == 0:
            conn.send(("result", getattr(obj, "worker_info", lambda: None)()))
        while True:
            command = conn.recv()
            if command[0] == "stop":
                break
            _, method, args, call_kwargs, every = command
            answers = every or rank == 0
            try:
                if isinstance(method, str):
                    result = getattr(obj, method)(*args, **call_kwargs)
                else:
                    result = method(obj, *args, **call_kwargs)
            except Exception as exc:
                if not raised_on_every_rank(exc):
                    raise
                if answers:
                    conn.send(("raised", exc))
                continue
            if answers:
                conn.send(("result", result))
        parallel.close()
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver, which ends the other ranks
        text = f"tensor-parallel rank {rank} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        try:
            payload = pickle.dumps(exc)
        except Exception:  # noqa: BLE001
            payload = None
        try:
            conn.send(("failed", time.time(), text, payload))
        except OSError:
            pass
        os._exit(1)
