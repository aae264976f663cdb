"""A model of the Gluon walk's barrier protocol (``walk_gluon_kernel.sparse_gdn_fwd_kernel_walk_gluon_ws3``, grouped
output), run under random interleavings of its four roles: today's hand-off and the pair hand-off of
``walk_pair_handoff.py``. CPU only; a check of the protocol as written down here, not of the kernel's code.

Each role is its sequence of barrier operations and buffer reads and writes per chunk, in the kernel's program order
(a product's operand is read where it is issued; the kernel waits for it before anything after it that another
role could see). A barrier is an mbarrier: ``count`` arrivals complete its current phase, and a wait on parity ``P``
passes once the phase of that parity has completed, i.e. while the phase in progress has the other parity. Every
buffer holds a tag naming what was written; every read asserts the tag it needs. A run fails on a wrong read (a
race the barriers let through) or a deadlock (no role can move, not all done).

    python3 benchmarks/tuning/next/walk_protocol_model.py     # both protocols, 20,000 interleavings each

Then the coupling ledger's cuts of the per-chunk hand-off: with both roles' hand-off waits cut nothing can hang;
with one role's alone, the other's arrivals run ahead of its waits and a parity wait that finds its barrier two
phases on waits for an arrival that never comes — the model deadlocks, and so would the kernel.
"""

import random


class Barrier:
    def __init__(self, count: int):
        self.count, self.pending, self.phase = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.phase = 0, self.phase + 1

    def passes(self, parity: int) -> bool:
        return (self.phase & 1) != parity


class Wrong(Exception):
    pass


def producer(n, b, mem):
    for i in range(n):
        yield ("wait", b["empty"][i % 2], ((i // 2) & 1) ^ 1)
        mem[("ring", i % 2)] = i
        b["ready"][i % 2].arrive()


def read(mem, key, want, who):
    if mem.get("check", True) and mem.get(key) != want:
        raise Wrong(f"{who} read {key} = {mem.get(key)!r}, needs {want!r}")


NO_WAIT = 2
"""A parity no phase has: a wait on it passes at once (a hand-off wait cut out, as the coupling ledger does)."""


def state(t, n, b, mem, pair, rng, free=False):
    mem[("slot0", t)] = ("S", 0)
    (b["s_ready"][t][0] if pair else b["s_ready"][t]).arrive()
    src = 0
    for i in range(n):
        even = i % 2 == 0
        yield ("wait", b["ready"][i % 2], (i // 2) & 1)
        read(mem, ("ring", i % 2), i, f"state {t} chunk {i} (K, V, Ct)")
        if not pair or even:
            read(mem, ("slot0", t), ("S", i), f"state {t} chunk {i} (K S)")
        elif src == 1:
            read(mem, ("slot1", t), ("R", i - 1), f"state {t} chunk {i} (K S from R)")
        else:
            read(mem, ("slot0", t), ("S", i - 1), f"state {t} chunk {i} (K S from S, scaled)")
        yield ("wait", b["u_done"][t], NO_WAIT if free else (i & 1) ^ 1)
        mem[("u", t)] = ("U", i)
        b["u_ready"][t].arrive()
        if even:
            if pair:
                yield ("wait", b["s_read"][t][1], ((i // 2) & 1) ^ 1)
            mem[("slot1", t)] = ("R", i)
        b["empty"][i % 2].arrive()
        if pair and even:
            b["s_ready"][t][1].arrive()
        elif pair:
            yield ("wait", b["s_read"][t][0], (i // 2) & 1)
            mem[("slot0", t)] = ("S", i + 1)
            b["s_ready"][t][0].arrive()
        else:
            yield ("wait", b["s_read"][t], NO_WAIT if free else i & 1)
            mem[("slot0", t)] = ("S", i + 1)
            b["s_ready"][t].arrive()
        src = rng.choice((0, 1)) if pair and even else 0  # the even chunk's event bit


def output(n, b, mem, pair, free=False):
    for i in range(n):
        yield ("wait", b["ready"][i % 2], (i // 2) & 1)
        read(mem, ("ring", i % 2), i, f"output chunk {i} (Q, K)")
        for t in (0, 1):
            par = i % 2
            if pair:
                yield ("wait", b["s_ready"][t][par], (i // 2) & 1)
            else:
                yield ("wait", b["s_ready"][t], NO_WAIT if free else i & 1)
            if par == 0:
                read(mem, ("slot0", t), ("S", i), f"output chunk {i} tile {t} (Q S)")
            else:
                read(mem, ("slot1", t), ("R", i - 1), f"output chunk {i} tile {t} (Q R)")
            (b["s_read"][t][par] if pair else b["s_read"][t]).arrive()
            yield ("wait", b["u_ready"][t], NO_WAIT if free else i & 1)
            read(mem, ("u", t), ("U", i), f"output chunk {i} tile {t} (A U)")
            b["u_done"][t].arrive()
        b["empty"][i % 2].arrive()


def run(n: int, pair: bool, rng: random.Random, free: tuple = ()) -> None:
    """One interleaving of an ``n``-chunk segment; ``free``: the roles ("state", "output") whose hand-off waits are
    cut (per-chunk hand-off only; reads are then not checked, only progress)."""

    def per_tile(make):
        return [make(), make()]

    b = {
        "ready": [Barrier(1), Barrier(1)],
        "empty": [Barrier(3), Barrier(3)],
        "u_ready": per_tile(lambda: Barrier(1)),
        "u_done": per_tile(lambda: Barrier(1)),
    }
    if pair:
        b["s_ready"] = per_tile(lambda: [Barrier(1), Barrier(1)])
        b["s_read"] = per_tile(lambda: [Barrier(1), Barrier(1)])
    else:
        b["s_ready"] = per_tile(lambda: Barrier(1))
        b["s_read"] = per_tile(lambda: Barrier(1))
    mem = {"check": not free}
    states = [state(t, n, b, mem, pair, rng, "state" in free) for t in (0, 1)]
    roles = [producer(n, b, mem), *states, output(n, b, mem, pair, "output" in free)]
    blocked = [None] * len(roles)  # the wait each role stands at
    live = set(range(len(roles)))
    while live:
        ready = [r for r in live if blocked[r] is None or blocked[r][1].passes(blocked[r][2])]
        if not ready:
            raise Wrong(f"deadlock at n = {n}: " + ", ".join(f"role {r} waits" for r in sorted(live)))
        r = rng.choice(ready)
        try:
            blocked[r] = next(roles[r])
        except StopIteration:
            live.discard(r)


def main():
    for pair in (False, True):
        rng = random.Random(1)
        for _ in range(20000):
            run(rng.randint(1, 9), pair, rng)
        print(f"{'pair hand-off' if pair else 'per-chunk hand-off'}: 20000 interleavings, no wrong read, no deadlock")
    # the coupling ledger's cuts (walk_coupling.py): which can hang
    for free in (("state", "output"), ("output",), ("state",)):
        rng = random.Random(3)
        try:
            for _ in range(2000):
                run(rng.randint(1, 9), False, rng, free)
            print(f"hand-off waits of {' and '.join(free)} cut: 2000 interleavings, no deadlock")
        except Wrong as e:
            print(f"hand-off waits of {' and '.join(free)} cut: {e}")


if __name__ == "__main__":
    main()
