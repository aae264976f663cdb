"""Decode split-kernel variants at 128K, MiniCPM4 geometry: CUDA-graph replays (split + library merge), L2 flushed."""
import json, os, sys, time, itertools
import torch
from triton.testing import do_bench
sys.path.insert(0, os.path.dirname(__file__))
import dec_kernels as DK
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
def launch(q, ks, vs, table, ids, seqlens, ns, warps, stages, pre, swap, nb, merge=True):
    B, Hq, _ = q.shape; S = table.shape[-1]; G = Hq // HKV
    eps = max(1, -(-S // ns)); eps = -(-eps // nb) * nb; nsplit = max(1, -(-S // eps))
    o = torch.empty_like(q); GP = 16; BD = 128
    acc = torch.empty(B * HKV, nsplit, GP, BD, dtype=torch.float32, device=dev)
    m = torch.empty(B * HKV, nsplit, GP, dtype=torch.float32, device=dev); l_ = torch.empty_like(m)
    DK.split_var[(B * HKV, nsplit)](q, ks, vs, table, ids, seqlens, acc, m, l_,
        q.stride(0), q.stride(1), ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
        table.stride(0), table.stride(1), ids.stride(0), ids.stride(1), S, nsplit, eps,
        D**-0.5 * 1.4426950408889634, HKV=HKV, G=G, GP=GP, D=D, BLOCK=64, EPSP=next_pow2(eps), NB=nb,
        PRE=pre, SWAP=swap, num_warps=warps, num_stages=stages)
    if merge:
        nsp = next_pow2(nsplit)
        K.decode_fwd_kernel_merge[(B * HKV, G)](acc, m, l_, o, o.stride(0), o.stride(1), nsplit, HKV=HKV, G=G, GP=GP,
            D=D, BD=BD, NSP=nsp, num_warps=4 if nsp <= 32 else 8)
    return o
def run_b(B):
    T = 131072; nb = cfg.num_blocks(T)
    kc = _normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=0); vc = _normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=1)
    q = _normal(B, HQ, D, device=dev, dtype=dt, seed=2); f = _normal(B, HKV, D, device=dev, dtype=dt, seed=3)
    seqlens = torch.full((B,), T, dtype=torch.int32, device=dev)
    k_cmp, _ = compress_keys(kc.transpose(1, 2)[:, :T], 32, 16)
    ids = forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T)
    ks, vs = resident_slots(kc, 64), resident_slots(vc, 64); table = resident_block_table(ids, nb)
    ref = sparse_decode(q, ks, vs, table, ids, seqlens)
    r = res[f"B{B}"] = {"default_us": round(graph_us(lambda: sparse_decode(q, ks, vs, table, ids, seqlens))[0], 2)}
    splits = (32, 24, 16) if B == 4 else (96, 48)
    for ns, pre, swap, nbk, stages, warps in itertools.product(splits, (0, 1), (0, 1), (1, 2), (2, 3, 4), (4, 8)):
        if warps == 8 and nbk == 1: continue
        key = f"s{ns}_p{pre}_sw{swap}_nb{nbk}_st{stages}_w{warps}"
        try:
            t, o = graph_us(lambda: launch(q, ks, vs, table, ids, seqlens, ns, warps, stages, pre, swap, nbk))
            r[key] = [round(t, 2), (o.float() - ref.float()).abs().max().item()]
        except Exception as e:
            r[key] = str(e)[:160]
        if time.time() - T0 > float(os.environ.get("BUDGET", 200)): break
    best = sorted((v[0], k) for k, v in r.items() if isinstance(v, list) and v[1] < 0.02)[:5]
    r["best"] = best
    print(f"[{time.time()-T0:.0f}s] B={B} default {r['default_us']} best {best}", flush=True)
    json.dump(res, open(f"{OUT}/dec_var.json", "w"), indent=1)
for B in (4, 1):
    run_b(B)
