"""To run on the H200: intra's inverse chain on fp16 operands (``intra_forward(f16_solve=True)``, the 16-bit MMA:
its accumulator is the next product's left operand without the shuffles of a tf32 operand) against the default tf32
chain, both with the refinement step and the split sub-diagonal product: the kept coefficients' errors against the
fp32 specification at four key spreads, and intra's time on the op's Gluon-path build (scores and dense Ct in the
tiles) at 32K and 128K, side by side in interleaved rounds.

Offline (Triton 3.6, sm_90a, 4 warps, 128 registers, no spills either way): 2,856 instructions on the fp16 path
against 3,344 (SHFL 196 / 372, SEL + FSEL 257 / 733, HMMA 104 / 136); the build holds both paths (4,536). CPU
emulation on alike keys (cosine ~0.99): the same errors as the tf32 chain (diagonal 1.6e-3, sub-diagonal 2.2e-3
after bf16 storage). Take it as the default for 16-bit inputs (``f16_solve`` in ``launch.run_intra``'s call) if
the 128K time falls and the errors stay; then run ``pytest -m gpu tests/ops/gdn -k "bf16_kernels_match or intra"``
and ``bench gdn``. ``python3 benchmarks/tuning/2026-12-02c/intra_f16.py`` (~1 min); writes ``$OUT/intra_f16.json``."""

import json
import os

import torch
from tests.helpers import rel_err
from tests.ops.gdn.helpers import spec_trace
from tests.ops.gdn.test_sparse_kernels import _coefficient_errors, _correlated_keys, _qwen_inputs

from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.bench.timing import benchmark_side_by_side
from longsparse.ops.gdn import SparseGDNConfig, launch
from longsparse.ops.gdn.intra import intra_forward

CAP = SparseGDNConfig().intra_registers
FORMS = {"tf32": False, "f16": True}
out = {}

(q, k, v, g, beta, *_), _ = _qwen_inputs([64 * 40 + 7])
for spread in (None, 0.3, 0.1, 0.01):
    keys = k if spread is None else _correlated_keys(k, spread=spread)
    trace = spec_trace(q.float(), keys.float(), v.float(), g, beta, SparseGDNConfig(backend="torch"))
    bos, lens = trace.layout.token_index[:, 0].int().cuda(), trace.layout.chunk_len.int().cuda()
    args = (keys[0].contiguous(), v[0].contiguous(), g[0].contiguous(), beta[0].contiguous(), bos, lens)
    for name, f16 in FORMS.items():
        ct, _, score = intra_forward(*args, max_registers=CAP, f16_solve=f16)
        out[f"err_{spread}_{name}"] = [round(e, 6) for e in _coefficient_errors(ct, trace)] + [
            round(rel_err(score.T.cpu().double(), trace.intra.score.cpu()), 6)
        ]
        print(f"err_{spread}_{name}", out[f"err_{spread}_{name}"], flush=True)


def time_forms(T: int) -> None:
    q, k, v, g, beta, *_ = make_inputs(1, T, shift=4.0)
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV).contiguous(), beta.reshape(T, HV).contiguous()
    plan = launch.plan_launch(1, T, None, q.device)
    tiles = torch.empty(plan.layout.NC, HV, 128, 64, dtype=q.dtype, device=q.device)

    def form(f16: bool):
        return lambda: intra_forward(kf, vf, gf, bf, plan.chunk_bos, plan.chunk_len, max_registers=CAP, q=qf,
                                     scores=tiles, kept_blocks=False, f16_solve=f16)  # fmt: skip

    calls = {name: form(f16) for name, f16 in FORMS.items()}
    tiles_out = {}
    for name, call in calls.items():
        call()
        tiles_out[name] = tiles.clone()
    out[f"tiles_rel_{T}"] = rel_err(tiles_out["f16"].float(), tiles_out["tf32"].float())
    for name, t in benchmark_side_by_side(calls, rounds=7).items():
        out[f"ms_{T}_{name}"] = round(t.median_ms, 4)
    print({key: val for key, val in out.items() if str(T) in key}, flush=True)


for T in (32768, 131072):
    time_forms(T)
with open(os.path.join(os.environ.get("OUT", "."), "intra_f16.json"), "w") as f:
    json.dump(out, f, indent=1)
