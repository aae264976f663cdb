"""Intra's fp16 solve with its tf32 fallback by a branch per (chunk, value head) or by a second launch
(``intra_forward(f16_fallback=)``), side by side on the H200 as the op runs intra on the Gluon walk's path (tiles
holding the dense ``Ct``, 128 registers), at the Qwen3.5-4B GDN geometry (``bench gdn``'s inputs, B = 1).

Per length: both forms' outputs (tiles, decays, tail scores) bit-equal; intra's time each way (``do_bench``
medians, interleaved) and the second launch's own device time (torch.profiler); the whole op with each form
(``launch.intra_forward`` wrapped to force the branch). Also keys of norm 2 (every chunk outside fp16's bound:
the branch takes tf32 everywhere, the relaunch fp16 everywhere and tf32 again where fp16 overflowed).

    timeout 240 python3 benchmarks/tuning/2026-12-04c/intra_relaunch.py     # on the H200: $OUT/intra_relaunch.json
"""

import json
import os
from unittest import mock

import torch
from triton.testing import do_bench

from longsparse.bench.gdn import make_inputs
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.intra import intra_forward

FORMS = ("branch", "relaunch")


def forced(fallback):
    """``launch.intra_forward`` with ``f16_fallback`` forced."""
    return lambda *a, **kw: intra_forward(*a, **{**kw, "f16_fallback": fallback})


def kernel_us(fn) -> dict:
    """Device time per kernel name (µs) of one call."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name] = out.get(e.name, 0.0) + e.device_time_total
    return {k: round(v, 1) for k, v in out.items() if "intra" in k}


def row(T: int, key_scale: float = 1.0) -> dict:
    cfg = SparseGDNConfig()
    q, k, v, g, beta, gate, w = make_inputs(1, T, 0.0)
    k = (k.float() * key_scale).bfloat16()
    plan = launch.plan_launch(1, T, None, q.device)
    q0, k0, v0, g0, b0 = q[0], k[0], v[0], g[0].float(), beta[0].float()
    walk = launch.resolve_walk(cfg, q0, v0, plan.layout.NC)
    assert walk[0] == "gluon", walk
    calls, outs = {}, {}
    for form in FORMS:
        with mock.patch.object(launch, "intra_forward", forced(form)):
            outs[form] = launch.run_intra(cfg, walk, q0, k0, v0, g0, b0, plan.chunk_bos, plan.chunk_len)

        def call(form=form):
            with mock.patch.object(launch, "intra_forward", forced(form)):
                return launch.run_intra(cfg, walk, q0, k0, v0, g0, b0, plan.chunk_bos, plan.chunk_len)

        calls[form] = call
    r = {"T": T, "key_scale": key_scale, "walk": list(walk)}
    (_, ga, sa, ta), (_, gb, sb, tb) = outs["branch"], outs["relaunch"]
    # the tiles' rows 0-63 are the walk's (it forms its scores itself): intra writes rows 64-127, the dense Ct
    r["bit_equal"] = bool(torch.equal(ta[:, :, 64:], tb[:, :, 64:]) and torch.equal(ga, gb) and torch.equal(sa, sb))
    r["finite"] = bool(torch.isfinite(sb).all() and torch.isfinite(tb[:, :, 64:]).all())
    for _ in range(3):  # interleaved rounds
        for form in FORMS:
            r.setdefault(f"intra_{form}_ms", []).append(do_bench(calls[form], warmup=25, rep=100))
    for form in FORMS:
        r[f"intra_{form}_ms"] = sorted(r[f"intra_{form}_ms"])[1]
        r[f"kernels_{form}_us"] = kernel_us(calls[form])
    if key_scale == 1.0:

        def op(form):
            def run():
                with mock.patch.object(launch, "intra_forward", forced(form)):
                    return sparse_chunk_gated_delta_rule(
                        q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=cfg, plan=plan
                    )

            return run

        oa, ob = op("branch")(), op("relaunch")()
        r["op_bit_equal"] = bool(torch.equal(oa[0], ob[0]) and torch.equal(oa[1], ob[1]))
        for _ in range(3):
            for form in FORMS:
                r.setdefault(f"op_{form}_ms", []).append(do_bench(op(form), warmup=25, rep=100))
        for form in FORMS:
            r[f"op_{form}_ms"] = sorted(r[f"op_{form}_ms"])[1]
    print(json.dumps(r), flush=True)
    return r


def main():
    rows = [row(32768), row(131072), row(32768, key_scale=2.0)]
    path = os.path.join(os.environ.get("OUT", "."), "intra_relaunch.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(path)


if __name__ == "__main__":
    main()
