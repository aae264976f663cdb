"""The op at 2K-16K tokens (B = 1, and 4 × 4K) with each walk kernel and each selector form, side by side:
``walk_kernel`` "triton" / "gluon" × ``select_kernel`` "one" / "three" (``SparseGDNConfig``). Both defaults at the
short end (the Triton walk below 16K, ``launch.GLUON_MIN_CHUNKS``; the one-launch selector up to 8K,
``select.SHORT_CHUNKS``) were chosen before FastLaunch, when the host's launches bound these calls; the 12-03 bench
shows 8K slower than 16K (0.42 against 0.38 ms), with the one-launch selector at 101 µs of device time there.

Per form: ``do_bench`` median (interleaved rounds, ``benchmark_side_by_side``), the host's issue time, 24 calls back
to back (a model's 24 GDN layers: what a prefill pays, host and device overlapped) and the kernels' device time by
torch.profiler; the outputs of every form against the default's (max abs difference).

    timeout 300 python3 benchmarks/tuning/2026-12-03b/short_end.py   # on the H200; $OUT/short_end.json
"""

import itertools
import json
import os

import torch

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark_side_by_side, host_issue_ms, kernel_times
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule

CASES = ((1, 2048), (1, 4096), (1, 8192), (1, 16384), (4, 4096))
FORMS = tuple(itertools.product(("triton", "gluon"), ("one", "three")))
LAYERS = 24


def layers_ms(fn) -> float:
    """ms per call of ``LAYERS`` calls issued back to back (median of 5 batches, events around each batch)."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(LAYERS):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / LAYERS)
    return sorted(samples)[2]


def case(B: int, T: int) -> dict:
    q, k, v, g, beta, gate, w = make_inputs(B, T, 4.0)
    plan = launch.plan_launch(B, T, None, q.device)

    def op(config):
        return lambda: sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=config, plan=plan
        )

    fns, out = {}, {}
    reference = op(SparseGDNConfig())()
    for walk, select in FORMS:
        name = f"{walk}/{select}"
        fn = op(SparseGDNConfig(walk_kernel=walk, select_kernel=select))
        try:
            o, s = fn()
        except Exception as exc:  # a form that cannot run this case: say why, time the others
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        fns[name] = fn
        out[name] = {
            "max_abs_diff_o": (o.float() - reference[0].float()).abs().max().item(),
            "max_abs_diff_state": (s.float() - reference[1].float()).abs().max().item(),
        }
    for name, t in benchmark_side_by_side(fns).items():
        out[name]["do_bench_ms"] = round(t.median_ms, 4)
    for name, fn in fns.items():
        out[name]["host_ms"] = round(host_issue_ms(fn), 4)
        out[name]["layers_ms"] = round(layers_ms(fn), 4)
        out[name].update(kernel_times(fn, width=60))
    return out


def main():
    result = {}
    for B, T in CASES:
        result[f"{B}x{T}"] = case(B, T)
        print(
            f"{B}x{T}",
            json.dumps({n: {k: v for k, v in r.items() if k != "kernels_us"} for n, r in result[f"{B}x{T}"].items()}),
            flush=True,
        )
    with open(os.path.join(os.environ.get("OUT", "."), "short_end.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
