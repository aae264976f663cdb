"""Intra's solve precision on keys correlated around one direction per head: the chain of the 16x16 inverses and the
sub-diagonal products in tf32, 3-pass tf32 or IEEE fp32, or the tf32 chain followed by one refinement step; the kept
coefficients' errors against the spec (fp32) at three key spreads, and the kernel's time at 32K and 128K on the
Gluon path's build (tiles only). Ran twice on the H200 on 2026-12-02 (``chain_prec.json``: the first six variants;
``chain_prec2.json``: tf32, x3_chain, refine, refine_x3sub) with intra.py carrying the experimental constexprs
``CHAIN_IEEE``/``CHAIN_X3`` (the chain's products only: ``_diag_inverse(L, eye, IEEE or CHAIN_IEEE, TF32X3 or
CHAIN_X3, REFINE)``) and ``SUB_X3`` (the two sub-diagonal products only); only ``REFINE`` was kept, so on later
code only the tf32 and refine variants run."""
import json, os, traceback
import torch
from longsparse.bench.gdn import HV, D, H, make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, intra, launch
from longsparse.ops.gdn.intra import BLOCK_ORDER
from tests.helpers import rel_err
from tests.ops.gdn.helpers import spec_trace
from tests.ops.gdn.test_sparse_kernels import _qwen_inputs, _correlated_keys

VARIANTS = {"tf32": {}, "x3_all": dict(TF32X3=True), "x3_chain": dict(CHAIN_X3=True), "ieee_chain": dict(CHAIN_IEEE=True),
            "ieee_chain_x3_sub": dict(CHAIN_IEEE=True, TF32X3=True), "ieee_all": dict(CHAIN_IEEE=True, IEEE=True),
            "refine": dict(REFINE=True), "refine_x3sub": dict(REFINE=True, SUB_X3=True)}
cap = SparseGDNConfig().intra_registers

def launch_kernel(kf, vf, gf, bf, qf, plan, NC, tiles, ct, gamma, score, kept, var):
    kw = dict(H=H, HV=HV, K=D, V=D, IEEE=False, TF32X3=False, STORE_SCORES=True, SCORE_ROWS=tiles.shape[2],
              STORE_KEPT=kept, TAIL_RELOAD=True, FAST_EXP=True, num_warps=4, maxnreg=cap)
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
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "chain_prec.json"), "w"), indent=1)
