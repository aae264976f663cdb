"""To run on the H200: the op with its selector in three launches (``SparseGDNConfig.select_kernel="three"``) and in
one (``"one"``; ``"auto"`` takes it up to ``select.SHORT_CHUNKS`` chunks per sequence) timed side by side in
interleaved rounds (``bench.timing.benchmark_side_by_side``), with and without a shared launch plan, at the lengths
where the short form applies; also the host issue time (short queued batches) and whether both forms decide alike.
``python3 benchmarks/tuning/2026-12-02b/select_side_by_side.py`` (~1 minute, no peers); writes
``$OUT/select_side_by_side.json``."""

import json
import os

import torch

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark_side_by_side, host_issue_ms
from longsparse.ops.gdn import SparseGDNConfig, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.launch import plan_launch

FORMS = ("three", "one")


def case(B: int, T: int) -> dict:
    q, k, v, g, beta, gate, w = make_inputs(B, T, 4.0)
    plan = plan_launch(B, T, None, q.device)
    calls, outputs = {}, {}
    for form in FORMS:
        cfg = SparseGDNConfig(select_kernel=form)

        def op(cfg=cfg, plan=None):
            return sparse_chunk_gated_delta_rule(
                q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=cfg, plan=plan
            )

        outputs[form] = op()
        calls[form] = op
        calls[f"{form}_planned"] = lambda op=op: op(plan=plan)
    row = {"B": B, "T": T}
    for name, t in benchmark_side_by_side(calls, rounds=7).items():
        row[f"{name}_ms"] = t.median_ms
    for name, fn in calls.items():
        row[f"{name}_host_ms"] = host_issue_ms(fn)
    (o3, s3), (o1, s1) = outputs["three"], outputs["one"]
    row["same_output"] = bool(torch.equal(o3, o1) and torch.equal(s3, s1))
    row["planned_speedup_one_vs_three"] = row["three_planned_ms"] / row["one_planned_ms"]
    row["speedup_one_vs_three"] = row["three_ms"] / row["one_ms"]
    print({k: round(x, 4) if isinstance(x, float) else x for k, x in row.items()}, flush=True)
    return row


if __name__ == "__main__":
    rows = [case(B, T) for B, T in ((1, 2048), (1, 4096), (1, 8192), (2, 4096), (4, 4096), (8, 8192))]
    with open(os.path.join(os.environ.get("OUT", "."), "select_side_by_side.json"), "w") as f:
        json.dump(rows, f, indent=1)
