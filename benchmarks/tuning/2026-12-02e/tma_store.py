"""Ran on the H200 on 2026-12-02 (17:15 UTC): the Gluon walk's output role storing whole chunks by TMA through a
shared-memory tile (the default since) against the same kernel with its plain stores from the accumulator layout (the form
before it), side by side. Whole op at the Qwen3.5-4B GDN geometry: B = 1 at 128K and 32K (walk device time by
torch.profiler, op medians) and a varlen call of odd lengths (its short chunks take the masked stores); outputs
must be equal bit for bit. ``timeout 240 python3 benchmarks/tuning/2026-12-02e/tma_store.py``; writes
``$OUT/tma_store.json``."""

import json
import os
import sys
import tempfile
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from walk_ledger import variant_module  # noqa: E402

from longsparse.bench.gdn import make_inputs  # noqa: E402
from longsparse.bench.timing import benchmark_side_by_side, self_time_by_kernel_us  # noqa: E402
from longsparse.ops.gdn import sparse_chunk_gated_delta_rule, walk_gluon  # noqa: E402
from longsparse.ops.gdn.launch import plan_launch  # noqa: E402

PLAIN = [(
    "_store_output(o, o_desc, o_s, scale * out, bos, n_rows, i_hv * V + t * BV, HV, V, MMA, INLINE_SCORES)",
    "_store_output(o, o_desc, o_s, scale * out, bos, n_rows, i_hv * V + t * BV, HV, V, MMA, False)",
)]  # fmt: skip
OUT = os.environ.get("OUT", ".")
VARLEN = [1000, 64, 4096 + 17, 129, 30000]


def op(module, q, k, v, g, beta, gate, w, plan, cu_seqlens=None):
    def call():
        with mock.patch.object(walk_gluon, "kernel_module", lambda: module):
            return sparse_chunk_gated_delta_rule(
                q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan,
                cu_seqlens=cu_seqlens,
            )

    return call


def main(folder: str) -> None:
    forms = {"tma": walk_gluon.kernel_module(), "plain": variant_module("plain", folder, PLAIN)}
    rows = []
    cases = [("B1", 131072, None), ("B1", 32768, None), ("varlen", sum(VARLEN), VARLEN)]
    for kind, T, lengths in cases:
        q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
        cu = None
        if lengths:
            cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=q.device)
        plan = plan_launch(1, T, cu, q.device)
        calls = {n: op(m, q, k, v, g, beta, gate, w, plan, cu) for n, m in forms.items()}
        (o_t, s_t), (o_p, s_p) = calls["tma"](), calls["plain"]()
        torch.cuda.synchronize()
        row = {"case": kind, "T": T, "lengths": lengths, "o_equal": bool(torch.equal(o_t, o_p)),
               "state_equal": bool(torch.equal(s_t, s_p)), "finite": bool(o_t.isfinite().all())}  # fmt: skip
        for n, call in calls.items():
            per_kernel = self_time_by_kernel_us(call, 10)
            row[f"{n}_walk_us"] = sum(t for name, t in per_kernel.items() if "walk_gluon" in name)
        times = benchmark_side_by_side(calls, rounds=3)
        row.update({f"{n}_ms": t.median_ms for n, t in times.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(OUT, "tma_store.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(folder)
