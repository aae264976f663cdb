"""To time on the H200: the sub-diagonal coefficient's first product ``D_b E_b`` with ``E_b`` split into two tf32
parts (``SUB_SPLIT``, ``intra_forward(sub_split=True)``: one product more) against the op's default (the tf32 chain
and its refinement step): the kept coefficients' errors against the spec (fp32) at three key spreads and the
kernel's time at 32K and 128K on the Gluon path's build. CPU emulation (``../2026-12-02/intra_precision/``,
operands truncated as the hardware reads them), spread 0.1: sub-diagonal error 3.1e-3 → 1.5e-3 (after bf16 storage
3.5e-3 → 2.2e-3); the offline build (Triton 3.6, sm_90a, 4 warps, 128 registers) has no spills either way. Take it
as the default (``sub_split`` in ``intra_forward``'s launch) if the 128K time grows by less than ~2 % and the
errors fall as emulated; then run ``pytest -m gpu tests/ops/gdn -k "bf16_kernels_match or intra"`` and
``bench gdn``. ``python3 benchmarks/tuning/2026-12-02b/intra_sub_split.py`` (~40 s); writes ``$OUT/intra_sub_split.json``."""
import json, os, traceback
import torch
from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, intra, launch
from longsparse.ops.gdn.intra import BLOCK_ORDER
from tests.helpers import rel_err
from tests.ops.gdn.helpers import spec_trace
from tests.ops.gdn.test_sparse_kernels import _qwen_inputs, _correlated_keys

VARIANTS = {"refine": dict(REFINE=True), "refine_split": dict(REFINE=True, SUB_SPLIT=True)}
cap = SparseGDNConfig().intra_registers

def launch_kernel(kf, vf, gf, bf, qf, plan, NC, tiles, ct, gamma, score, kept, var):
    kw = dict(H=H, HV=HV, K=D, V=D, IEEE=False, TF32X3=False, STORE_SCORES=True, SCORE_ROWS=tiles.shape[2],
              STORE_KEPT=kept, FAST_EXP=True, num_warps=4, maxnreg=cap)
    kw.update(var)
    intra.sparse_gdn_fwd_kernel_intra_blocks[(NC, H)](kf, vf, gf, bf, ct if kept else tiles, gamma, score,
        plan.chunk_bos, plan.chunk_len, qf, tiles, **kw)

out = {}
# accuracy: kept-block coefficients against the spec on one sequence, three key spreads
L = 64 * 40 + 7
for spread in (None, 0.3, 0.1):
    (q, k, v, g, beta, *_), cu = _qwen_inputs([L])
    if spread:
        k = _correlated_keys(k, spread=spread)
    t1 = spec_trace(q.float(), k.float(), v.float(), g, beta, SparseGDNConfig(backend="torch"))
    plan = launch.plan_launch(1, L, None, q.device); NC = plan.layout.NC
    kf, vf, qf = k[0].contiguous(), v[0].contiguous(), q[0].contiguous()
    gf, bf = g[0].contiguous(), beta[0].contiguous()
    for name, var in VARIANTS.items():
        try:
            tiles = torch.empty(NC, HV, 64, 64, dtype=q.dtype, device=q.device)
            ct = torch.empty(NC, HV, 7, 16, 16, dtype=q.dtype, device=q.device)
            gamma = torch.empty(NC, HV, dtype=torch.float32, device=q.device); score = torch.empty_like(gamma)
            launch_kernel(kf, vf, gf, bf, qf, plan, NC, tiles, ct, gamma, score, True, var)
            torch.cuda.synchronize()
            errs = []
            for b, (_, j) in enumerate(BLOCK_ORDER):
                e_Gj = t1.inputs.G[:, :, 16 * j : 16 * j + 16].exp()
                errs.append(round(rel_err(ct[:, :, b].float().transpose(0, 1) * e_Gj[..., None, :], t1.intra.cbar[:, :, b]), 5))
            out[f"err_{spread}_{name}"] = errs + [round(rel_err(score.T, t1.intra.score), 5)]
        except Exception as e:
            out[f"err_{spread}_{name}"] = repr(e)[:300]
        print(f"err_{spread}_{name}", out[f"err_{spread}_{name}"], flush=True)
for T in (32768, 131072):
    q, k, v, g, beta, *_ = make_inputs(1, T, shift=4.0)
    qf, kf, vf = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, HV, D)
    gf, bf = g.reshape(T, HV).contiguous(), beta.reshape(T, HV).contiguous()
    plan = launch.plan_launch(1, T, None, q.device); NC = plan.layout.NC
    tiles = torch.empty(NC, HV, 128, 64, dtype=q.dtype, device=q.device)
    gamma = torch.empty(NC, HV, dtype=torch.float32, device=q.device); score = torch.empty_like(gamma)
    for name, var in VARIANTS.items():
        try:
            call = lambda var=var: launch_kernel(kf, vf, gf, bf, qf, plan, NC, tiles, None, gamma, score, False, var)
            call(); torch.cuda.synchronize()
            out[f"ms_{T}_{name}"] = round(benchmark(call).median_ms, 4)
        except Exception as e:
            out[f"ms_{T}_{name}"] = repr(e)[:300]
        print(f"ms_{T}_{name}", out[f"ms_{T}_{name}"], flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "intra_sub_split.json"), "w"), indent=1)
