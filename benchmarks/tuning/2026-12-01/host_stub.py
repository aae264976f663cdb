"""Host time of one SparseGDN op call with every Triton launch stubbed out (CPU tensors, Qwen3.5-4B geometry, a
kept launch plan): what the op's own Python costs besides the launches. ``python host_stub.py 4096`` (``PROFILE=1``
adds a cProfile). 2026-12-01, on a shared 2-core CPU machine of CI's kind: 142-175 µs per 4K call at
the fastest of 7 batches (medians 178-289 µs), 5 launches; 14 ``torch.empty`` ~75 µs of a profiled call. The launches' own host time (Triton's binder and launcher) comes on top and is not
measured here."""
import os, time, cProfile, pstats, sys
import torch
import triton
from triton.runtime.jit import JITFunction
launches = []
class _Stub:
    def __init__(self, fn): self.fn = fn
    def __getitem__(self, grid):
        def run(*a, **k): launches.append(self.fn.__name__)
        return run
JITFunction.__getitem__ = lambda self, grid: _Stub(self.fn)[grid]
from longsparse.ops.gdn import SparseGDNConfig, launch
from longsparse.bench.gdn import make_inputs
T = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0, device="cpu")
cfg = SparseGDNConfig()
launch.supports = lambda *a: None  # the stubbed launches run anywhere
plan = launch.plan_launch(1, T, None, q.device)
def call():
    return launch.sparse_gdn_triton_forward(q, k, v, g, beta, None, None, True, False, None, gate=gate,
                                            gate_norm_weight=w, config=cfg, plan=plan)
for _ in range(20): call()
launches.clear()
n, batches = 200, []
for _ in range(7):  # the fastest of 7 batches: the host is shared
    t0 = time.perf_counter()
    for _ in range(n): call()
    batches.append((time.perf_counter() - t0) / n)
per = len(launches) // (7 * n)
print(f"T={T}: {min(batches)*1e6:.1f} us per call (launches stubbed; fastest of 7 batches of {n}, median "
      f"{sorted(batches)[3]*1e6:.1f}), {per} launches per call: {launches[:per]}")
if os.environ.get("PROFILE"):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200): call()
    pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(25)
