"""To run on the H200: where the host time of a short SparseGDN call goes. At T = 4K-16K the op is host-bound
(``bench gdn``: ``ours_host_ms`` 0.36-0.38 ms at 4K against 0.28 ms of stage device time; FLA's host 0.50-0.66), and
with its launches stubbed on a CPU machine (``../2026-12-01/host_stub.py``) its own Python takes only 56-85 µs, so
most of the host time is in the launches. This splits it: the host time to issue (``bench.timing.host_issue_ms``,
short queued batches) of the whole planned call, of each stage alone (intra: one launch; selection: three; main
pass: entry + walk) next to its device time, and of a bare Triton launch with 1, 8, 16 and 32 tensor arguments (and 0
or 12 constexprs) — what one launch costs by its argument count. The selector also alone in its one-launch form
(``select_one``, ``SparseGDNConfig.select_kernel="one"``, first run here) and in its three launches
(``select_three``), with their decisions compared; ``op_select_auto``: the op with ``select_kernel="auto"``.
``python3 benchmarks/tuning/2026-12-02b/host_split.py``
(~1 minute, no peers); writes ``$OUT/host_split.json``."""

import json
import os

import torch
import triton
import triton.language as tl

from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.bench.timing import benchmark, host_issue_ms
from longsparse.ops.gdn import SparseGDNConfig, launch, select, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.intra import intra_forward


@triton.jit
def _bare(x, y, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr, E: tl.constexpr,
          F: tl.constexpr, G: tl.constexpr, H: tl.constexpr, I: tl.constexpr, J: tl.constexpr, K: tl.constexpr,
          L: tl.constexpr):  # fmt: skip
    tl.store(x + tl.program_id(0), tl.load(y + tl.program_id(0)) + A + L)


@triton.jit
def _ptrs1(a0):  # fmt: skip
    tl.store(a0 + tl.program_id(0), 1.0)


@triton.jit
def _ptrs8(a0, a1, a2, a3, a4, a5, a6, a7):  # fmt: skip
    tl.store(a0 + tl.program_id(0), 1.0)


@triton.jit
def _ptrs16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):  # fmt: skip
    tl.store(a0 + tl.program_id(0), 1.0)


@triton.jit
def _ptrs32(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31):  # fmt: skip
    tl.store(a0 + tl.program_id(0), 1.0)


def bare_launch_us() -> dict:
    x = torch.zeros(1024, device="cuda")
    out = {}
    for n, kern in ((1, _ptrs1), (8, _ptrs8), (16, _ptrs16), (32, _ptrs32)):
        args = [x] * n
        kern[(1,)](*args)
        out[f"bare_{n}_ptrs_us"] = 1e3 * host_issue_ms(lambda kern=kern, args=args: kern[(1,)](*args))
    consts = dict(A=1, B=2, C=3, D=4, E=5, F=6, G=7, H=8, I=9, J=10, K=11, L=12)
    _bare[(1,)](x, x, **consts)
    out["bare_2_ptrs_12_constexpr_us"] = 1e3 * host_issue_ms(lambda: _bare[(1,)](x, x, **consts))
    return out


def stages(T: int) -> dict:
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    cfg = SparseGDNConfig()
    plan = launch.plan_launch(1, T, None, q.device)
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV), beta.reshape(T, HV)
    bos, clen, layout = plan.chunk_bos, plan.chunk_len, plan.layout
    walk = launch.resolve_walk(cfg, qf, vf, layout.NC)
    ct_op, gamma, score, scores = launch.run_intra(cfg, walk, qf, kf, vf, gf, bf, bos, clen)
    ct = ct_op if ct_op is not None else intra_forward(kf, vf, gf, bf, bos, clen, max_registers=cfg.intra_registers)[0]
    sel, prefix = launch.run_selection(plan, score, gamma, H, cfg, gate, w, details=False)

    sel_args = (layout, score, gamma, HV // H, cfg, gate, w)

    def one_launch(**kw):
        """The one-launch selector, also at 16K (256 chunks: its sm_90a build at CP 256 has 255 registers and no
        spills) where the op takes the three launches: would a threshold of 256 pay?"""
        default, select.SHORT_CHUNKS = select.SHORT_CHUNKS, max(select.SHORT_CHUNKS, 256)
        try:
            return select.select_events_gpu(*sel_args, short=True, **kw)
        finally:
            select.SHORT_CHUNKS = default

    def op():
        return sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, config=cfg, plan=plan
        )

    def op_one_launch_selector():
        return sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan,
            config=SparseGDNConfig(select_kernel="auto"),
        )  # fmt: skip

    calls = {
        "op": op,
        "op_select_auto": op_one_launch_selector,
        "intra": lambda: launch.run_intra(cfg, walk, qf, kf, vf, gf, bf, bos, clen),
        "select": lambda: launch.run_selection(plan, score, gamma, H, cfg, gate, w, details=False),
        # the selector in one launch (select_kernel "one"; "auto" up to select.SHORT_CHUNKS chunks) and in three
        "select_one": lambda: one_launch(details=False),
        "select_three": lambda: select.select_events_gpu(*sel_args, details=False, short=False),
        "main": lambda: launch._main_pass(qf, kf, vf, gf, ct, gamma, sel, layout, plan.lengths, bos, clen, None,
                                          D**-0.5, cfg, plan=plan, prefix=prefix, scores=scores, walk=walk),
    }  # fmt: skip
    row = {"T": T, "walk": walk[0]}
    short = layout.Cmax <= 256
    if not short:
        del calls["select_one"]
    for name, fn in calls.items():
        fn()
        row[f"{name}_host_us"] = 1e3 * host_issue_ms(fn)
        row[f"{name}_device_us"] = 1e3 * benchmark(fn).median_ms
    if short:
        one, three = one_launch(), select.select_events_gpu(*sel_args, short=False)
        row["select_one_equals_three"] = bool(torch.equal(one.mask, three.mask) and torch.equal(one.tier, three.tier))
    return row


if __name__ == "__main__":
    result = {"bare": bare_launch_us(), "stages": [stages(T) for T in (4096, 8192, 16384)]}
    print(json.dumps(result, indent=1), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "host_split.json"), "w") as f:
        json.dump(result, f, indent=1)
