"""Where the op's host time goes: at 4K, 16K and 32K (B = 1, Qwen3.5-4B GDN geometry, the bench's inputs) the call's
host issue time (``bench.timing.host_issue_ms``) is as long as its device time or longer (``bench gdn``
2026-12-02 17:26: 0.25 / 0.46 / 0.48 ms of host time), so the kernels wait for the host.

For each length this writes to ``$OUT/host_profile/``:

* ``host_ms.json``: host issue time of the whole op (with and without a plan) and of its stages called alone,
  each with the same arguments the op gives them (``launch.run_intra``, ``launch.run_selection``,
  ``launch._main_pass``, and inside it the walk's launch and its TMA descriptors), and the device time of the op;
* ``cprofile_<T>.txt``: cProfile of 200 calls, by own time and by cumulative time;
* ``launches_<T>.txt``: torch.profiler's table of one call's host-side ops and CUDA API calls (the launches).

    timeout 200 python3 benchmarks/tuning/2026-12-03/host_profile.py   # on the H200
"""

import cProfile
import io
import json
import os
import pstats

import torch
import triton
import triton.language as tl

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark, host_issue_ms
from longsparse.ops import _launch
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule, walk_gluon

OUT = os.path.join(os.environ.get("OUT", "."), "host_profile")
SHIFT = 4.0
LENGTHS = (4096, 16384, 32768)


def stage_calls(q, k, v, g, beta, gate, w, plan, config):
    """No-argument callables of the op's stages, each with the arguments the op passes (as ``run_kernels``)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    qf, kf, vf = q.reshape(B * T, H, K), k.reshape(B * T, H, K), v.reshape(B * T, HV, V)
    gf, bf = g.reshape(B * T, HV).contiguous(), beta.reshape(B * T, HV).contiguous()
    layout = plan.layout
    walk = launch.resolve_walk(config, qf, vf, layout.NC)
    ct, gamma, score, scores = launch.run_intra(config, walk, qf, kf, vf, gf, bf, plan.chunk_bos, plan.chunk_len)
    selection, prefix = launch.run_selection(plan, score, gamma, H, config, gate, w, details=False)

    def main_pass():
        return launch._main_pass(
            qf, kf, vf, gf, ct, gamma, selection, layout, plan.lengths, plan.chunk_bos, plan.chunk_len, None,
            K**-0.5, config, plan=plan, prefix=prefix, scores=scores, walk=walk,
        )  # fmt: skip

    calls = {
        "resolve_walk": lambda: launch.resolve_walk(config, qf, vf, layout.NC),
        "intra": lambda: launch.run_intra(config, walk, qf, kf, vf, gf, bf, plan.chunk_bos, plan.chunk_len),
        "selection": lambda: launch.run_selection(plan, score, gamma, H, config, gate, w, details=False),
        "main_pass": main_pass,
    }
    if walk[0] == "gluon":
        o = torch.empty_like(vf)
        forms = launch.gluon_forms_scores(config)
        calls["walk_descriptors"] = lambda: walk_gluon.descriptors(qf, kf, vf, scores, walk[1], forms, o)
    return calls


def profile_length(T: int, config: SparseGDNConfig) -> dict:
    """Host and device times at ``T`` tokens, and the cProfile and launch tables of the op there."""
    q, k, v, g, beta, gate, w = make_inputs(1, T, SHIFT)
    plan = launch.plan_launch(1, T, None, q.device)

    def op(plan=None):
        return sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=config, plan=plan
        )

    def planned():
        return op(plan)

    op(), planned()
    row = {}
    for label, on in (("jit_", False), ("", True)):  # launches through Triton's JIT, then through FastLaunch
        fast_launch(on)
        row.update({
            f"{label}op_device_ms": benchmark(op).median_ms,
            f"{label}op_planned_device_ms": benchmark(planned).median_ms,
            f"{label}op_host_ms": host_issue_ms(op),
            f"{label}op_planned_host_ms": host_issue_ms(planned),
        })  # fmt: skip
    for name, fn in stage_calls(q, k, v, g, beta, gate, w, plan, config).items():
        row[f"{name}_host_ms"] = host_issue_ms(fn)
    print(T, {key: round(val, 4) for key, val in row.items()}, flush=True)

    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(200):
        op()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    for order in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=text).sort_stats(order).print_stats(45)
    with open(os.path.join(OUT, f"cprofile_{T}.txt"), "w") as f:
        f.write(text.getvalue())

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as p:
        for _ in range(3):
            op()
        torch.cuda.synchronize()
    with open(os.path.join(OUT, f"launches_{T}.txt"), "w") as f:
        f.write("3 calls\n")
        f.write(p.key_averages().table(sort_by="count", row_limit=80, max_name_column_width=90))
    return row


@triton.jit
def _empty_kernel(a, b, c, d, e, f, g, h, i, j, n, x, N: tl.constexpr, M: tl.constexpr):
    pass


def fast_launch(on: bool) -> None:
    """Every kernel launched so far through FastLaunch (``on``) or through the JIT."""
    for launcher in _launch._KEPT.values():
        if hasattr(launcher, "_names"):
            launcher._fast = on


def calibration() -> dict:
    """Host cost of the primitives a call is made of: an empty Triton launch with ten tensors, two scalars and two
    constexprs; ``torch.empty``; a view; ``get_device_properties``."""
    ts = [torch.empty(64, device="cuda") for _ in range(10)]
    dev = ts[0].device
    launcher = _launch.fast(_empty_kernel)
    return {
        "triton_empty_launch_ms": host_issue_ms(lambda: _empty_kernel[(64,)](*ts, 7, 0.5, N=4, M=8), calls=64),
        "fast_empty_launch_ms": host_issue_ms(lambda: launcher[(64,)](*ts, 7, 0.5, N=4, M=8), calls=64),
        "torch_empty_ms": host_issue_ms(lambda: torch.empty(1024, 64, device=dev), calls=64),
        "view_ms": host_issue_ms(lambda: ts[0].view(8, 8), calls=64),
        "device_properties_ms": host_issue_ms(lambda: torch.cuda.get_device_properties(dev), calls=64),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    config = SparseGDNConfig()
    result = {"calibration": calibration()}
    print(result, flush=True)
    result.update({T: profile_length(T, config) for T in LENGTHS})
    with open(os.path.join(OUT, "host_ms.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
