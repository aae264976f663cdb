"""The SparseGDN call's own host work, measured on a CPU machine: every launch stubbed after FastLaunch has built its
key and argument list (what the H200's host does per launch besides Triton's launcher and the driver), on CPU
tensors at Qwen3.5-4B GDN geometry, B = 1, with a kept launch plan, the Gluon walk's path taken as on Hopper from 16K
(its TMA descriptors built on the CPU tensors). What it leaves out: Triton's compiled launcher and the driver's
launch (~15-20 µs each on the H200, six launches), and the CUDA caching allocator's ``torch.empty`` (~2-5 µs there
against ~1 here). So it prices the Python that a leaner host path can remove, not the call's whole host time.

    python benchmarks/tuning/2026-12-04/host_cpu.py [T ...]      # default 4096 16384 32768; PROFILE=1 adds cProfile
"""

import cProfile
import json
import os
import pstats
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # compiled-mode JIT functions, so that FastLaunch takes its fast path

import torch  # noqa: E402

from longsparse.bench.gdn import make_inputs  # noqa: E402
from longsparse.ops import _launch  # noqa: E402
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule, walk_gluon  # noqa: E402

LAUNCHES: list[str] = []


def stub_launches():
    """FastLaunch builds its key and argument list as on the GPU, then records the kernel instead of launching."""

    def run(self, grid, args, kwargs):
        key = self._key(args, kwargs)
        self._compiled.get(key)
        self._all_args(args, kwargs)
        LAUNCHES.append(getattr(self.kernel, "__name__", str(self.kernel)))

    _launch.FastLaunch.run = run
    torch.cuda.current_device = lambda: 0
    launch.supports = lambda *a: None
    walk_gluon.supports = lambda *a: None


def measure(T: int, batches: int = 7, calls: int = 100) -> dict:
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0, device="cpu")
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    config = SparseGDNConfig(backend="triton")
    plan = launch.plan_launch(1, T, None, q.device)

    def op():
        return sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=config, plan=plan
        )

    for _ in range(5):
        op()
    LAUNCHES.clear()
    per_batch = []
    for _ in range(batches):  # the fastest batch: the host is shared
        t0 = time.perf_counter()
        for _ in range(calls):
            op()
        per_batch.append((time.perf_counter() - t0) / calls * 1e6)
    launches = LAUNCHES[: len(LAUNCHES) // (batches * calls)]
    row = {"T": T, "host_us_min": round(min(per_batch), 1), "host_us_median": round(sorted(per_batch)[batches // 2], 1),
           "launches": launches}  # fmt: skip
    if os.environ.get("PROFILE"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            op()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return row


if __name__ == "__main__":
    stub_launches()
    lengths = [int(x) for x in sys.argv[1:]] or [4096, 16384, 32768]
    torch.set_num_threads(1)
    rows = [measure(T) for T in lengths]
    for row in rows:
        print(json.dumps(row))
