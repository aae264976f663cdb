"""To run on the H200: the Gluon walk forming its intra-chunk scores itself (``SparseGDNConfig(walk_scores=
"inline")``) against reading the scores intra stores (the default), whole op at the Qwen3.5-4B GDN geometry, B = 1,
T = 32K and 128K: outputs and final states against each other, the device time per kernel (torch.profiler) and the
op side by side. Inline, intra reads no q and writes no scores (0.54 + 0.54 GB less at 128K) and the walk loads the
tiles' Ct rows alone (0.54 GB less), for one more ``[64, 64, 128]`` product and the decay on its triangle per step.

Two inline forms: the library's (``A_c`` through each state warpgroup's own shared buffer, 24 / 104 B of spills
per-chunk / grouped in the sm_90a build) and a variant built here from the library's source with ``A_c`` kept in
registers as the output product's left operand (84 / 56 B). ``python3 benchmarks/tuning/2026-12-02c/inline_scores.py``
(~2 min); writes ``$OUT/inline_scores.json``.

Ran on commit 2801c19, the tree that had the inline form; the form was dropped in the next commit (slower), so this
script needs that commit to run again."""

import importlib.util
import json
import os
import tempfile
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark_side_by_side
from longsparse.ops.gdn import SparseGDNConfig, sparse_chunk_gated_delta_rule, walk_gluon
from longsparse.ops.gdn.launch import plan_launch

CALLS = 10
LIBRARY_KERNELS = walk_gluon.kernel_module


def register_operand_module():
    """The library's walk kernels with ``A_c`` held in registers (DotOperandLayout) rather than stored to shared."""
    src = open(LIBRARY_KERNELS().__file__).read()
    old_store = "        a_t.store(_inline_scores(qk, G, n_rows, MMA).to(dt))\n"
    new_store = (
        "        a_op = gl.convert_layout(_inline_scores(qk, G, n_rows, MMA).to(dt),\n"
        "                                 gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))\n"
    )
    old_out = "    out = warpgroup_mma(a_t, u_s, eG * qs, is_async=True)\n"
    new_out = (
        "    if INLINE_SCORES:\n        out = warpgroup_mma(a_op, u_s, eG * qs, is_async=True)\n"
        "    else:\n        out = warpgroup_mma(a_t, u_s, eG * qs, is_async=True)\n"
    )
    assert src.count(old_store) == 1 and src.count(old_out) == 1
    path = os.path.join(tempfile.mkdtemp(), "walk_inline_regs.py")
    with open(path, "w") as f:
        f.write(src.replace(old_store, new_store).replace(old_out, new_out))
    spec = importlib.util.spec_from_file_location("walk_inline_regs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REGS = register_operand_module()
FORMS = {  # name: (config, kernel module)
    "stored": (SparseGDNConfig(), LIBRARY_KERNELS),
    "inline": (SparseGDNConfig(walk_scores="inline"), LIBRARY_KERNELS),
    "inline_regs": (SparseGDNConfig(walk_scores="inline"), lambda: REGS),
}


def device_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(T: int) -> dict:
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = plan_launch(1, T, None, q.device)

    def op(form):
        config, kernels = FORMS[form]

        def call():
            walk_gluon.kernel_module = kernels
            return sparse_chunk_gated_delta_rule(
                q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan, config=config
            )

        return call

    row = {"T": T}
    outs = {form: op(form)() for form in FORMS}
    o_ref, s_ref = outs["stored"]
    for form, (o, s) in outs.items():
        row[f"{form}_finite"] = bool(o.isfinite().all() and s.isfinite().all())
        row[f"{form}_o_rel_vs_stored"] = rel(o, o_ref)
        row[f"{form}_state_rel_vs_stored"] = rel(s, s_ref)
    for form in FORMS:
        call = op(form)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
        per_kernel = defaultdict(float)
        for event in prof.key_averages():
            if device_us(event) > 0:
                per_kernel[event.key] += device_us(event) / CALLS
        row[f"{form}_kernels_us"] = dict(sorted(per_kernel.items(), key=lambda x: -x[1]))
    times = benchmark_side_by_side({form: op(form) for form in FORMS}, rounds=5)
    row.update({f"{form}_ms": t.median_ms for form, t in times.items()})
    walk_gluon.kernel_module = LIBRARY_KERNELS
    print(json.dumps(row, indent=1), flush=True)
    return row


if __name__ == "__main__":
    result = [run(T) for T in (32768, 131072)]
    with open(os.path.join(os.environ.get("OUT", "."), "inline_scores.json"), "w") as f:
        json.dump(result, f, indent=1)
