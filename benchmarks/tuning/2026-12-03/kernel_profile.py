"""Device time of each kernel of one op call at 8K, 32K and 128K (B = 1, Qwen3.5-4B GDN geometry, the bench's inputs),
by torch.profiler over 10 calls: which stage of the op the remaining time is in, the selector's three launches
included; and, at 2K-8K, the whole op with the one-launch selector against the three launches
(``SparseGDNConfig.select_kernel``), side by side: the one-launch form was chosen up to 8K on 2026-12-02, when the
host's launches bound the call (before FastLaunch).

    timeout 200 python3 benchmarks/tuning/2026-12-03/kernel_profile.py   # on the H200; $OUT/kernel_profile.json
"""

import json
import os

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark_side_by_side, kernel_times
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule

LENGTHS = (8192, 32768, 131072)
CALLS = 10


def op_kernel_times(T: int) -> dict:
    """``{kernel name: µs per call}`` of the op at ``T`` tokens, and the op's summed kernel time."""
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)

    def op():
        return sparse_chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            output_final_state=True,
            gate=gate,
            gate_norm_weight=w,
            config=SparseGDNConfig(),
            plan=plan,
        )

    return kernel_times(op, calls=CALLS, warmup=3)


def select_forms(T: int) -> dict:
    """Op ms at ``T`` tokens with ``select_kernel`` "one" and "three" (medians over interleaved rounds)."""
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)

    def op(config):
        return lambda: sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=config, plan=plan
        )

    fns = {form: op(SparseGDNConfig(select_kernel=form)) for form in ("one", "three")}
    return {form: round(t.median_ms, 4) for form, t in benchmark_side_by_side(fns).items()}


def main():
    result = {T: op_kernel_times(T) for T in LENGTHS}
    result["select_forms_ms"] = {T: select_forms(T) for T in (2048, 4096, 8192)}
    print(json.dumps(result, indent=1), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "kernel_profile.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
