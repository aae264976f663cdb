"""The op's ``bounded_inputs`` (intra's fp16 solve with no per-chunk range test) against the tested form, side by
side on the H200 at the Qwen3.5-4B GDN geometry (``bench gdn``'s inputs, B = 1, shared plan as in a model), and
the intra kernel's warps and register cap swept for the smaller build that form compiles to (3,840 -> 2,152 SASS
instructions offline, ``scripts/kernel_report.py --only intra-gluon-ct --mix``).

Per length: the op's outputs and final states bit-equal both ways; the op's time both ways and its kernels' device
times (torch.profiler); intra alone (``launch.run_intra``) per form. Medians of interleaved ``do_bench`` rounds.

    timeout 300 python3 benchmarks/tuning/2026-12-04d/bounded_intra.py   # on the H200: $OUT/bounded_intra.json
"""

import dataclasses
import json
import os

import torch
from triton.testing import do_bench

from longsparse.bench.gdn import make_inputs
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule

ROUNDS = 5
INTRA_FORMS = {  # name: (bounded, warps, register cap)
    "checked_w4_r128": (False, 4, 128),
    "bounded_w4_r128": (True, 4, 128),
    "bounded_w4_r96": (True, 4, 96),
    "bounded_w4_free": (True, 4, None),
    "bounded_w8_r128": (True, 8, 128),
    "bounded_w8_free": (True, 8, None),
}


def interleaved(calls: dict) -> dict:
    """Median ms of each call over ``ROUNDS`` interleaved ``do_bench`` rounds."""
    samples = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, fn in calls.items():
            samples[name].append(do_bench(fn, warmup=25, rep=100))
    return {name: sorted(s)[len(s) // 2] for name, s in samples.items()}


def kernel_us(fn) -> dict:
    """Device time per kernel (µs) of one call, by name."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name] = out.get(e.name, 0.0) + e.device_time_total
    return {k[:60]: round(v, 1) for k, v in out.items()}


def row(T: int) -> dict:
    cfg = SparseGDNConfig()
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    plan = launch.plan_launch(1, T, None, q.device)
    r = {"T": T}

    def op(bounded):
        return lambda: sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=cfg, plan=plan,
            bounded_inputs=bounded,
        )  # fmt: skip

    (o0, s0), (o1, s1) = op(False)(), op(True)()
    r["op_bit_equal"] = bool(torch.equal(o0, o1) and torch.equal(s0, s1))
    r["op_finite"] = bool(torch.isfinite(o1).all())
    times = interleaved({"checked": op(False), "bounded": op(True)})
    r["op_checked_ms"], r["op_bounded_ms"] = times["checked"], times["bounded"]
    r["op_kernels_checked_us"] = kernel_us(op(False))
    r["op_kernels_bounded_us"] = kernel_us(op(True))

    q0, k0, v0, g0, b0 = q[0], k[0], v[0], g[0].float(), beta[0].float()
    walk = launch.resolve_walk(cfg, q0, v0, plan.layout.NC)
    r["walk"] = list(walk)
    calls = {}
    for name, (bounded, warps, regs) in INTRA_FORMS.items():
        c = dataclasses.replace(cfg, intra_warps=warps, intra_registers=regs)
        calls[name] = lambda c=c, b=bounded: launch.run_intra(
            c, walk, q0, k0, v0, g0, b0, plan.chunk_bos, plan.chunk_len, b
        )  # fmt: skip
    ref = calls["checked_w4_r128"]()
    for name, fn in calls.items():
        out = fn()
        tiles = 3  # the tiles: rows 64-127 (the dense Ct) are intra's; rows 0-63 belong to the walk
        same = torch.equal(out[1], ref[1]) and torch.equal(out[2], ref[2])
        same = same and torch.equal(out[tiles][:, :, 64:], ref[tiles][:, :, 64:])
        r[f"intra_{name}_bit_equal"] = bool(same)
    r.update({f"intra_{name}_ms": t for name, t in interleaved(calls).items()})
    print(json.dumps(r), flush=True)
    return r


def main():
    rows = [row(T) for T in (32768, 65536, 131072)]
    path = os.path.join(os.environ.get("OUT", "."), "bounded_intra.json")
    with open(path, "w") as f:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        json.dump({**meta, "commit": os.environ.get("LONGSPARSE_GIT_COMMIT"), "rows": rows}, f, indent=1)
    print(path)


if __name__ == "__main__":
    main()
