"""Tensor-parallel worker processes on the CPU (gloo): a rank that raises while the others wait for it in a
collective ends every worker and raises its error on the driver; so does a rank that is killed; an error every rank
raised before a collective leaves the workers running; a driver that is killed takes its workers with it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longsparse.distributed.workers import RankFailure, Workers
from tests.distributed.faulty import Ranks

pytestmark = pytest.mark.slow

ENDS_WITHIN_S = 30
"""A failure reaches the driver at once; what takes time is each worker's exit (up to SIGTERM's grace)."""


def _ended(workers: Workers) -> bool:
    return all(not p.is_alive() for p in workers._processes)


def test_an_error_on_every_rank_leaves_the_workers_running_and_a_rank_that_raises_ends_them():
    workers = Workers(2, Ranks, {})
    try:
        assert workers.info == 2
        assert workers.call("total", 1.5) == 3.0
        with pytest.raises(ValueError, match="rank 1 refuses this request"):
            workers.call("refuse_on", 1)
        assert workers.call("total", 2.0) == 4.0  # still in step
        start = time.monotonic()
        with pytest.raises(RankFailure, match="rank 1 failed: ValueError: rank 1 cannot go on") as failure:
            workers.call("fail", 1, "raise")
        assert time.monotonic() - start < ENDS_WITHIN_S
        assert failure.value.rank == 1 and isinstance(failure.value.__cause__, ValueError)
        assert "in fail" in str(failure.value)  # the rank's traceback
        assert _ended(workers)
        with pytest.raises(RuntimeError, match="workers have ended: tensor-parallel rank 1 failed"):
            workers.call("total", 1.0)
    finally:
        workers.close()


def test_a_rank_that_dies_ends_every_worker():
    workers = Workers(2, Ranks, {})
    try:
        start = time.monotonic()
        with pytest.raises(RankFailure, match="rank 1 was killed by SIGKILL"):
            workers.call("fail", 1, "die")
        assert time.monotonic() - start < ENDS_WITHIN_S
        assert _ended(workers)
    finally:
        workers.close()


DRIVER = """
import time
from longsparse.distributed.workers import Workers
from tests.distributed.faulty import Ranks
if __name__ == "__main__":
    workers = Workers(2, Ranks, {})
    print(*[p.pid for p in workers._processes], flush=True)
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


def test_workers_of_a_killed_driver_exit(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    root = Path(__file__).parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2 and all(_running(p) for p in pids)
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + ENDS_WITHIN_S
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_running(p) for p in pids)
