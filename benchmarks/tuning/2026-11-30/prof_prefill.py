"""Block-sparse prefill attention launch variants (warps x stages x tile) at MiniCPM4 geometry, 128K, B=1."""
import json, os, time
import torch
from triton.testing import do_bench
from longsparse.ops.sparse_attn import MINICPM4, compress_keys, forecast_select, block_sparse_attention
from longsparse.ops.sparse_attn.launch import load_kernels, next_pow2
from longsparse.bench.attn import _smooth, _normal

OUT = os.environ.get("OUT", "."); res = {}; T0 = time.time()
K = load_kernels("prefill", "longsparse.ops.sparse_attn")
cfg = MINICPM4; dev = torch.device("cuda"); dt = torch.bfloat16; HQ, HKV, D = 32, 2, 128; G = 16
def launch(q, k, v, plan, warps, stages):
    B, T = q.shape[:2]; BT = plan.tile_tokens; o = torch.empty_like(q)
    blocks, bits, counts = plan.blocks, plan.token_bits, plan.counts
    K.prefill_fwd_kernel_attn[(-(-T // BT), B * HKV)](q, k, v, o, blocks, bits, counts, T,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        blocks.stride(0), blocks.stride(1), blocks.stride(2), counts.stride(0), counts.stride(1),
        D**-0.5 * 1.4426950408889634, HKV=HKV, G=G, GP=16, D=D, BD=128, BT=BT, BLOCK=64, BM=BT * 16,
        DOT_PRECISION="tf32", num_warps=warps, num_stages=stages)
    return o
B, T = 1, 131072
q = _smooth(B, T, HQ, D, device=dev, dtype=dt, seed=0); f = _smooth(B, T, HKV, D, device=dev, dtype=dt, seed=1)
k = _normal(B, T, HKV, D, device=dev, dtype=dt, seed=2); v = _normal(B, T, HKV, D, device=dev, dtype=dt, seed=3)
k_cmp, _ = compress_keys(k, 32, 16)
for bt in (4, 8, 16):
    sel = forecast_select(f, k_cmp, cfg, tile_tokens=bt)
    ref = block_sparse_attention(q, k, v, sel, 64)
    r = res[f"tile{bt}"] = {"default_ms": do_bench(lambda: block_sparse_attention(q, k, v, sel, 64), warmup=20, rep=100)}
    for warps in (4, 8):
        for stages in (1, 2, 3, 4):
            try:
                o = launch(q, k, v, sel.plan, warps, stages)
                r[f"w{warps}_st{stages}"] = [round(do_bench(lambda: launch(q, k, v, sel.plan, warps, stages), warmup=20, rep=100), 2),
                                             (o.float() - ref.float()).abs().max().item()]
            except Exception as e:
                r[f"w{warps}_st{stages}"] = str(e)[:160]
    print(f"[{time.time()-T0:.0f}s]", bt, json.dumps(r), flush=True)
    json.dump(res, open(f"{OUT}/prof_prefill.json", "w"), indent=1)
    del sel; torch.cuda.empty_cache()
