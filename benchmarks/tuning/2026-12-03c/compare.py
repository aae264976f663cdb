"""Shared by this folder's scripts: the op with several Gluon walk kernel modules, compared against the first one.

Per case (B, T at the Qwen3.5-4B GDN geometry, the op as it runs by default): whether each module's outputs and
final states equal the first module's bit for bit (and the largest output difference), each walk's device time
(torch.profiler, ``CALLS`` calls) and the whole op side by side (``bench.timing.benchmark_side_by_side``)."""

import json
import os
import sys
from unittest import mock

import torch

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark_side_by_side, self_time_by_kernel_us
from longsparse.ops.gdn import SparseGDNConfig, sparse_chunk_gated_delta_rule, walk_gluon
from longsparse.ops.gdn.launch import plan_launch

CASES = [(1, 131072), (1, 32768), (4, 32768)]
CALLS = 10


def compare(modules: dict, label: str, cases=CASES) -> list[dict]:
    """Rows of ``modules`` (name -> kernel module; the first is the reference) into ``$OUT/{label}.json``."""
    out = os.environ.get("OUT", ".")
    names = list(modules)
    rows = []
    for B, T in cases:
        q, k, v, g, beta, gate, w = make_inputs(B, T, 4.0)
        plan = plan_launch(B, T, None, q.device)

        def op(module, inputs=(q, k, v, g, beta), gate=gate, w=w, plan=plan):
            def call():
                with mock.patch.object(walk_gluon, "kernel_module", lambda: module):
                    return sparse_chunk_gated_delta_rule(
                        *inputs, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan,
                        config=SparseGDNConfig(),
                    )

            return call

        o_ref, s_ref = op(modules[names[0]])()
        row = {"B": B, "T": T}
        for name in names[1:]:
            o, s = op(modules[name])()
            torch.cuda.synchronize()
            row[f"{name}_o_equal"] = bool(torch.equal(o, o_ref))
            row[f"{name}_state_equal"] = bool(torch.equal(s, s_ref))
            row[f"{name}_o_max_abs_diff"] = (o.float() - o_ref.float()).abs().max().item()
        for name, module in modules.items():
            per_kernel = self_time_by_kernel_us(op(module), CALLS)
            row[f"{name}_walk_us"] = sum(t for n, t in per_kernel.items() if "walk_gluon" in n)
        times = benchmark_side_by_side({n: op(m) for n, m in modules.items()}, rounds=5)
        row.update({f"{n}_op_ms": t.median_ms for n, t in times.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(out, f"{label}.json"), "w") as f:
            json.dump({"cases": rows, "command": " ".join(sys.argv)}, f, indent=1)
    return rows
