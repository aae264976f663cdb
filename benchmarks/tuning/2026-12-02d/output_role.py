"""To run on the H200: the warp-specialised Gluon walk with the output's products in a warpgroup of their own
(``SparseGDNConfig(walk_output_role=True)``), with stored scores and forming them itself (``walk_scores="inline"``:
intra reads no q and writes the tiles' Ct rows alone), against the default form; whole op at the Qwen3.5-4B GDN
geometry, B = 1, T = 128K and 32K: outputs and final states against the default's, the walk's and intra's device
time (torch.profiler) and the op side by side. ``timeout 200 python3 benchmarks/tuning/2026-12-02d/output_role.py``;
writes ``$OUT/output_role.json`` after each length."""

import json
import os

import torch

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark_side_by_side, self_time_by_kernel_us
from longsparse.ops.gdn import SparseGDNConfig, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.launch import plan_launch

CALLS = 10
OUT = os.environ.get("OUT", ".")
FORMS = {
    "default": SparseGDNConfig(),
    "output_role": SparseGDNConfig(walk_output_role=True),
    "output_role_inline": SparseGDNConfig(walk_output_role=True, walk_scores="inline"),
}


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(T: int, result: list) -> None:
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = plan_launch(1, T, None, q.device)

    def op(name: str):
        config = FORMS[name]

        def call():
            return sparse_chunk_gated_delta_rule(
                q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan, config=config
            )

        return call

    row = {"T": T}
    o_ref, s_ref = op("default")()
    for name in FORMS:
        o, s = op(name)()
        torch.cuda.synchronize()
        row[f"{name}_finite"] = bool(o.isfinite().all() and s.isfinite().all())
        row[f"{name}_o_rel"], row[f"{name}_state_rel"] = rel(o, o_ref), rel(s, s_ref)
        print(json.dumps(row), flush=True)
    for name in FORMS:
        per_kernel = self_time_by_kernel_us(op(name), CALLS)
        row[f"{name}_walk_us"] = sum(t for n, t in per_kernel.items() if "walk_gluon" in n)
        row[f"{name}_intra_us"] = sum(t for n, t in per_kernel.items() if "intra" in n)
    times = benchmark_side_by_side({name: op(name) for name in FORMS}, rounds=3)
    row.update({f"{n}_ms": t.median_ms for n, t in times.items()})
    print(json.dumps(row), flush=True)
    result.append(row)
    with open(os.path.join(OUT, "output_role.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    rows: list = []
    for T in (131072, 32768):
        run(T, rows)
