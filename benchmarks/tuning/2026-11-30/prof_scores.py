"""Forecast scores kernel launch variants (BN blocks per step x warps) at 128K; tile-16 plan on i.i.d. forecasts."""
import json, os, time
import torch
from triton.testing import do_bench
from longsparse.ops.sparse_attn import MINICPM4, compress_keys, forecast_select, block_sparse_attention
from longsparse.ops.sparse_attn.launch import load_kernels, next_pow2
from longsparse.bench.attn import _smooth, _normal

OUT = os.environ.get("OUT", "."); res = {}; T0 = time.time()
K = load_kernels("select", "longsparse.ops.sparse_attn")
cfg = MINICPM4; dev = torch.device("cuda"); dt = torch.bfloat16; HQ, HKV, D = 32, 2, 128
def scores(f, k_cmp, scratch, T, BN, warps, BT=64):
    B = f.shape[0]; N = k_cmp.shape[1]
    K.select_fwd_kernel_scores[(-(-T // BT), B * HKV)](f, k_cmp, scratch, T, N, 0,
        f.stride(0), f.stride(1), f.stride(2), k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2),
        scratch.stride(0), scratch.stride(1), scratch.stride(2), 1.4426950408889634,
        HKV=HKV, G=1, GP=1, D=D, BD=128, BT=BT, BN=BN, KS=32, ST=16, P=cfg.pool_stride, R1=cfg.pool_overlap,
        SOFTMAX=False, DOT_PRECISION="tf32", BM=BT, BNC=BN * cfg.pool_stride, BLOCK=64, INIT=cfg.init_blocks,
        LOCAL=cfg.local_blocks, num_warps=warps)
for B, T in ((1, 131072), (4, 32768)):
    f = _smooth(B, T, HKV, D, device=dev, dtype=dt, seed=1)
    k = _normal(B, T, HKV, D, device=dev, dtype=dt, seed=2)
    k_cmp, _ = compress_keys(k, 32, 16)
    NB = cfg.num_blocks(T)
    ref = torch.full((B, HKV, T, next_pow2(NB)), float("nan"), device=dev)
    scores(f, k_cmp, ref, T, 16, 4)
    r = res[f"B{B}_T{T}"] = {}
    for BN in (16, 32, 64):
        for warps in (4, 8):
            try:
                out = torch.full_like(ref, float("nan"))
                scores(f, k_cmp, out, T, BN, warps)
                same = torch.equal(torch.nan_to_num(out, nan=7.0), torch.nan_to_num(ref, nan=7.0))
                t = do_bench(lambda: scores(f, k_cmp, out, T, BN, warps), warmup=20, rep=100)
                r[f"bn{BN}_w{warps}"] = [round(t, 3), same]
            except Exception as e:
                r[f"bn{BN}_w{warps}"] = str(e)[:200]
    print(f"[{time.time()-T0:.0f}s]", B, T, json.dumps(r), flush=True)
    del ref, out; torch.cuda.empty_cache()
# tile-16 plan on i.i.d. forecasts (the worst case of a wide tile), B=1, 128K
T = 131072
fi = _normal(1, T, HKV, D, device=dev, dtype=dt, seed=5); qi = _normal(1, T, HQ, D, device=dev, dtype=dt, seed=4)
k = _normal(1, T, HKV, D, device=dev, dtype=dt, seed=2); v = _normal(1, T, HKV, D, device=dev, dtype=dt, seed=3)
k_cmp, _ = compress_keys(k, 32, 16)
for bt in (4, 16):
    sel = forecast_select(fi, k_cmp, cfg, tile_tokens=bt)
    res[f"iid_tile{bt}"] = {"union": sel.plan.counts.float().mean().item(),
                            "attn_ms": do_bench(lambda: block_sparse_attention(qi, k, v, sel, 64), warmup=20, rep=100)}
    print(bt, res[f"iid_tile{bt}"], flush=True)
json.dump(res, open(f"{OUT}/prof_scores.json", "w"), indent=1)
