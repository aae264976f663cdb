"""The csr output kernel's sm_90 builds stay off exactly 48 KiB of shared memory (the default dynamic limit: every
such build stopped with an illegal memory access on the H200, docs/gdn-kernels.md). Compiled here without a GPU by
``scripts/kernel_report.py`` with the ptxas that ships in Triton's wheel, at the launcher's pipeline depth."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(
    not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists(),
    reason="this Triton build ships no ptxas",
)
def test_output_kernel_builds_avoid_the_48_kib_boundary():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kernel_report.py"), "--only", "output", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    builds = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    launch = pytest.importorskip("longsparse.ops.gdn.launch")
    assert len(builds) == 8 and {b["stages"] for b in builds} == {launch.OUTPUT_NUM_STAGES}
    on_the_boundary = [b for b in builds if b["shared"] == 48 * 1024]
    assert not on_the_boundary, on_the_boundary


@pytest.mark.skipif(
    not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm").exists(),
    reason="this Triton build ships no nvdisasm",
)
def test_kernel_report_counts_each_builds_instruction_mix():
    """``--mix``: the static SASS counts by class that compare two builds of one kernel offline (e.g. intra's tf32
    and fp16 solves); every class is a part of the total, and a kernel of products has tensor-core instructions."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kernel_report.py"), "--only", "scores", "--mix", "--json"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    builds = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    base = {"kernel", "warps", "stages", "regs", "spill_bytes", "shared", "instructions"}
    assert builds
    for build in builds:
        counts = [count for name, count in build.items() if name not in base]
        assert len(counts) >= 5 and build["mma"] > 0 and sum(counts) < build["instructions"], build
        assert build["shared"] > 1024, build  # the build's shared memory in bytes, not the count of its accesses
