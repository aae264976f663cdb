"""Decode top-k: the library's binary search vs WAYS-ary searches (WAYS 2/4/8 x warps 2/4/8), 128K, MiniCPM4 config;
8 calls on 8 layers' score rows in one CUDA graph (L2 flushed before each replay), and the whole Forecast selection."""
import json, os, sys, time, itertools
import torch
from triton.testing import do_bench
sys.path.insert(0, os.path.dirname(__file__))
import topk_kernels as TK
from longsparse.ops.sparse_attn import MINICPM4, compress_keys, forecast_select_decode
from longsparse.ops.sparse_attn import select as SEL
from longsparse.ops.sparse_attn.launch import load_kernels, next_pow2
from longsparse.bench.attn import _normal
OUT = os.environ.get("OUT", "."); res = {}; T0 = time.time()
dev = torch.device("cuda"); dt = torch.bfloat16; HKV, D = 2, 128; cfg = MINICPM4; K = load_kernels("select", "longsparse.ops.sparse_attn")
def layered_us(fns):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for f in fns: f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns: f()
    g.replay(); torch.cuda.synchronize()
    return round(do_bench(g.replay, warmup=20, rep=150) * 1e3 / len(fns), 2)
T = 131072; NB = cfg.num_blocks(T); NBP = next_pow2(NB); W = cfg.decode_width()
for B in (4, 1):
    seqlens = torch.full((B,), T, dtype=torch.int32, device=dev)
    f = _normal(B, HKV, D, device=dev, dtype=dt, seed=3)
    k_cmps = [compress_keys(_normal(B, T, HKV, D, device=dev, dtype=dt, seed=10 + i), 32, 16)[0] for i in range(8)]
    refs = [forecast_select_decode(f, k, seqlens, cfg, max_seqlen=T) for k in k_cmps]
    # the score rows the library's top-k reads: run its scoring launch into our own scratch
    scratches = []
    orig = SEL._launch_topk
    def grab(kernels, scratch, *a, **kw):
        scratches.append(scratch.clone()); return orig(kernels, scratch, *a, **kw)
    SEL._launch_topk = grab
    for k in k_cmps: forecast_select_decode(f, k, seqlens, cfg, max_seqlen=T)
    SEL._launch_topk = orig
    r = res[f"B{B}"] = {}
    outs = [torch.empty(B, HKV, W, dtype=torch.int32, device=dev) for _ in scratches]
    r["library_topk_us"] = layered_us([lambda s=s, o=o: orig(K, s, seqlens, o, None, 0, 0, 1, 1, cfg, NBP, decode=True) for s, o in zip(scratches, outs)])
    r["library_select_us"] = layered_us([lambda k=k: forecast_select_decode(f, k, seqlens, cfg, max_seqlen=T) for k in k_cmps])
    for ways, warps in itertools.product((2, 4, 8), (2, 4, 8)):
        def call(s, o, ways=ways, warps=warps):
            TK.topk_decode_ways[(B * HKV,)](s, seqlens, o, s.stride(0), s.stride(1), o.stride(0), o.stride(1), HKV=HKV,
                NBP=NBP, S=W, SP=next_pow2(W), BLOCK=64, INIT=cfg.init_blocks, LOCAL=cfg.local_blocks,
                BUDGET=cfg.budget_blocks, DENSE_LEN=cfg.dense_len, WAYS=ways, num_warps=warps)
        try:
            t = layered_us([lambda s=s, o=o: call(s, o) for s, o in zip(scratches, outs)])
            same = all(torch.equal(o, rf) for o, rf in zip(outs, refs))
            r[f"w{ways}_warps{warps}"] = [t, same]
        except Exception as e:
            r[f"w{ways}_warps{warps}"] = str(e)[:200]
    print(f"[{time.time()-T0:.0f}s] B={B} {json.dumps(r)}", flush=True)
    json.dump(res, open(f"{OUT}/topk_var.json", "w"), indent=1)
