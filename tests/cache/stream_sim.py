"""A deterministic simulation of CUDA stream semantics for the block cache's transfer protocol.

Work is deferred: ``run`` / ``record`` / ``wait`` only enqueue. :meth:`SimulatedStreams.drain` then executes the two
queues in an order chosen by a policy — ``"compute_first"`` (transfers lag as far as the events allow),
``"transfer_first"`` (transfers run as early as they can) or a seeded random interleaving — honouring exactly what
CUDA guarantees: program order within a queue, and a wait holds its queue until the record it refers to (the latest
one enqueued before the wait) has executed. ``drop_waits`` removes waits on events whose name starts with one of the
given prefixes: a broken protocol, for negative controls.
"""

from __future__ import annotations

import random
from collections import deque

from longsparse.cache.streams import COMPUTE, QUEUES, TRANSFER, Streams


class Deadlock(RuntimeError):
    pass


class SimulatedStreams(Streams):
    def __init__(self, policy: str = "random", seed: int = 0, drop_waits: tuple[str, ...] = ()):
        if policy not in ("compute_first", "transfer_first", "random"):
            raise ValueError(f"unknown policy {policy!r}")
        self.policy = policy
        self.rng = random.Random(seed)
        self.drop_waits = drop_waits
        self.queues = {q: deque() for q in QUEUES}
        self.recorded: dict[str, int] = {}
        self.fired: dict[str, int] = {}
        self.executed = 0

    def run(self, queue, work):
        self.queues[queue].append(("run", work))

    def record(self, queue, event):
        n = self.recorded[event] = self.recorded.get(event, 0) + 1
        self.queues[queue].append(("record", event, n))

    def wait(self, queue, event):
        n = self.recorded.get(event, 0)
        if n and not event.startswith(self.drop_waits):
            self.queues[queue].append(("wait", event, n))

    def _ready(self, queue) -> bool:
        q = self.queues[queue]
        if not q:
            return False
        op = q[0]
        return op[0] != "wait" or self.fired.get(op[1], 0) >= op[2]

    def _step(self, queue) -> None:
        op = self.queues[queue].popleft()
        if op[0] == "run":
            op[1]()
        elif op[0] == "record":
            self.fired[op[1]] = max(self.fired.get(op[1], 0), op[2])
        self.executed += 1

    def drain(self) -> None:
        while any(self.queues.values()):
            ready = [q for q in QUEUES if self._ready(q)]
            if not ready:
                raise Deadlock(f"both queues wait: {[q[0] if q else None for q in self.queues.values()]}")
            if self.policy == "compute_first":
                queue = COMPUTE if COMPUTE in ready else TRANSFER
            elif self.policy == "transfer_first":
                queue = TRANSFER if TRANSFER in ready else COMPUTE
            else:
                queue = self.rng.choice(ready)
            self._step(queue)

    def hold(self, tensor, queue):
        return  # the deferred closures keep their tensors alive

    def synchronize(self):
        self.drain()

    def forget_events(self):
        self.recorded.clear()
