"""Decode split-kernel launch variants (num_warps x num_stages x splits) at 128K, B=4 and 1: graph replays."""
import json, os, time
import torch
from triton.testing import do_bench
from longsparse.ops.sparse_attn import MINICPM4, compress_keys, forecast_select_decode, resident_slots, resident_block_table, sparse_decode
from longsparse.ops.sparse_attn.launch import load_kernels, next_pow2
from longsparse.bench.attn import _normal

OUT = os.environ.get("OUT", "."); res = {}; T0 = time.time()
def graph_us(fn):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay(); torch.cuda.synchronize()
    return do_bench(g.replay, warmup=20, rep=150) * 1e3, out
K = load_kernels("decode", "longsparse.ops.sparse_attn")
cfg = MINICPM4; dev = torch.device("cuda"); dt = torch.bfloat16; HQ, HKV, D = 32, 2, 128
def launch(q, ks, vs, table, ids, seqlens, ns, warps, stages):
    B, Hq, _ = q.shape; S = table.shape[-1]; G = Hq // HKV
    eps = max(1, -(-S // ns)); nsplit = max(1, -(-S // eps))
    o = torch.empty_like(q); GP = 16; BD = 128
    acc = torch.empty(B * HKV, nsplit, GP, BD, dtype=torch.float32, device=dev)
    m = torch.empty(B * HKV, nsplit, GP, dtype=torch.float32, device=dev); l_ = torch.empty_like(m)
    K.decode_fwd_kernel_split[(B * HKV, nsplit)](q, ks, vs, table, ids, seqlens, o, acc, m, l_,
        q.stride(0), q.stride(1), ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
        table.stride(0), table.stride(1), ids.stride(0), ids.stride(1), o.stride(0), o.stride(1), S, nsplit, eps,
        D**-0.5 * 1.4426950408889634, HKV=HKV, G=G, GP=GP, D=D, BD=BD, BLOCK=64, FINAL=False, DOT_PRECISION="tf32",
        num_warps=warps, num_stages=stages)
    nsp = next_pow2(ns)
    K.decode_fwd_kernel_merge[(B * HKV, G)](acc, m, l_, o, o.stride(0), o.stride(1), nsplit, HKV=HKV, G=G, GP=GP,
        D=D, BD=BD, NSP=nsp, num_warps=4 if nsp <= 32 else 8)
    return o
for B in (4, 1):
    T = 131072; nb = cfg.num_blocks(T)
    kc = _normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=0); vc = _normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=1)
    q = _normal(B, HQ, D, device=dev, dtype=dt, seed=2); f = _normal(B, HKV, D, device=dev, dtype=dt, seed=3)
    seqlens = torch.full((B,), T, dtype=torch.int32, device=dev)
    k_cmp, _ = compress_keys(kc.transpose(1, 2)[:, :T], 32, 16)
    ids = forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T)
    ks, vs = resident_slots(kc, 64), resident_slots(vc, 64); table = resident_block_table(ids, nb)
    ref = sparse_decode(q, ks, vs, table, ids, seqlens)
    r = res[f"B{B}"] = {"default_us": graph_us(lambda: sparse_decode(q, ks, vs, table, ids, seqlens))[0]}
    for ns in (32, 48, 96):
        for warps in (4, 8):
            for stages in (1, 2, 3):
                try:
                    t, o = graph_us(lambda: launch(q, ks, vs, table, ids, seqlens, ns, warps, stages))
                    r[f"s{ns}_w{warps}_st{stages}"] = [round(t, 2), (o.float() - ref.float()).abs().max().item()]
                except Exception as e:
                    r[f"s{ns}_w{warps}_st{stages}"] = str(e)[:200]
    print(f"[{time.time()-T0:.0f}s]", B, json.dumps(r), flush=True)
    json.dump(res, open(f"{OUT}/prof_dec.json", "w"), indent=1)
