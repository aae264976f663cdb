"""Decode split variants + in-kernel (ticket) merge, timed as 8 calls on 8 distinct caches in one CUDA graph (L2 zero-flushed before)."""
import json, os, sys, time, itertools
import torch
sys.path.insert(0, os.path.dirname(__file__))
import dec_kernels as DK
from longsparse.ops.sparse_attn import MINICPM4, compress_keys, forecast_select_decode, resident_slots, resident_block_table, sparse_decode
from longsparse.ops.sparse_attn.launch import load_kernels, next_pow2
from longsparse.bench.attn import _normal
OUT = os.environ.get("OUT", "."); res = {}; T0 = time.time()
dev = torch.device("cuda"); dt = torch.bfloat16; HQ, HKV, D = 32, 2, 128; cfg = MINICPM4
junk = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=dev)
K = load_kernels("decode", "longsparse.ops.sparse_attn")
def graph(fns):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for f in fns: f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [f() for f in fns]
    g.replay(); torch.cuda.synchronize(); return g, outs
def seq_us(fns, n=100):
    g, outs = graph(fns); ts = []
    for _ in range(n):
        junk.zero_(); a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / len(fns))
    ts.sort(); return round(ts[len(ts) // 2], 2), outs
class Launch:
    def __init__(s, B, S, ns, warps, stages, pre, nb, fuse, ch, merge=True):
        G = HQ // HKV; eps = max(1, -(-S // ns)); eps = -(-eps // nb) * nb; s.nsplit = max(1, -(-S // eps)); s.eps = eps
        s.acc = torch.empty(B * HKV, s.nsplit, 16, D, dtype=torch.float32, device=dev)
        s.m = torch.empty(B * HKV, s.nsplit, 16, dtype=torch.float32, device=dev); s.l = torch.empty_like(s.m)
        s.cnt = torch.zeros(B * HKV, dtype=torch.int32, device=dev)
        s.kw = dict(HKV=HKV, G=G, GP=16, D=D, BLOCK=64, EPSP=next_pow2(eps), NB=nb, PRE=pre, SWAP=0, FUSE=fuse,
                    NSP=max(ch, next_pow2(s.nsplit)), CH=ch, num_warps=warps, num_stages=stages)
        s.B, s.G, s.fuse, s.merge = B, G, fuse, merge
    def __call__(s, q, ks, vs, table, ids, seqlens):
        o = torch.empty_like(q); S = table.shape[-1]
        DK.split_var[(s.B * HKV, s.nsplit)](q, ks, vs, table, ids, seqlens, s.acc, s.m, s.l, s.cnt, o, o.stride(0), o.stride(1),
            q.stride(0), q.stride(1), ks.stride(0), ks.stride(1), vs.stride(0), vs.stride(1),
            table.stride(0), table.stride(1), ids.stride(0), ids.stride(1), S, s.nsplit, s.eps,
            D**-0.5 * 1.4426950408889634, **s.kw)
        if not s.fuse and s.merge:
            nsp = next_pow2(s.nsplit)
            K.decode_fwd_kernel_merge[(s.B * HKV, s.G)](s.acc, s.m, s.l, o, o.stride(0), o.stride(1), s.nsplit, HKV=HKV, G=s.G, GP=16,
                D=D, BD=D, NSP=nsp, num_warps=4 if nsp <= 32 else 8)
        return o
N = 8; T = 131072; nb = cfg.num_blocks(T)
for B in (4, 1):
    caches = [(_normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=10 * i), _normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=10 * i + 1)) for i in range(N)]
    slots = [(resident_slots(kc, 64), resident_slots(vc, 64)) for kc, vc in caches]
    q = _normal(B, HQ, D, device=dev, dtype=dt, seed=2); f = _normal(B, HKV, D, device=dev, dtype=dt, seed=3)
    seqlens = torch.full((B,), T, dtype=torch.int32, device=dev)
    k_cmp, _ = compress_keys(caches[0][0].transpose(1, 2), 32, 16)
    ids = forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T); table = resident_block_table(ids, nb)
    refs = [sparse_decode(q, s[0], s[1], table, ids, seqlens) for s in slots]
    r = res[f"B{B}"] = {}
    r["library"] = seq_us([lambda s=s: sparse_decode(q, s[0], s[1], table, ids, seqlens) for s in slots])[0]
    S = table.shape[-1]
    grid = list(itertools.product((32, 24, 16) if B == 4 else (96, 64, 48, 32), (0, 1), (1, 2), (2, 3), (0, 1), (4, 8)))
    for ns, pre, nbk, stages, fuse, ch in grid:
        if not fuse and ch == 8: continue
        key = f"s{ns}_p{pre}_nb{nbk}_st{stages}_f{fuse}_ch{ch}"
        try:
            L = Launch(B, S, ns, 4, stages, pre, nbk, fuse, ch)
            t, outs = seq_us([lambda s=s, L=L: L(q, s[0], s[1], table, ids, seqlens) for s in slots])
            err = max((o.float() - rr.float()).abs().max().item() for o, rr in zip(outs, refs))
            r[key] = [t, err, int(L.cnt.abs().sum().item())]
            if not fuse and pre == 0 and nbk == 1:
                L2 = Launch(B, S, ns, 4, stages, pre, nbk, 0, 4, merge=False)
                r[key + "_splitonly"] = seq_us([lambda s=s, L2=L2: L2(q, s[0], s[1], table, ids, seqlens) for s in slots])[0]
        except Exception as e:
            r[key] = str(e)[:200]
    r["best"] = sorted((v[0], k) for k, v in r.items() if isinstance(v, list) and v[1] < 0.02 and v[2] == 0)[:6]
    print(f"[{time.time()-T0:.0f}s] B={B} library {r['library']} best {r['best']}", flush=True)
    print({k: v for k, v in r.items() if "splitonly" in k}, flush=True)
    json.dump(res, open(f"{OUT}/dec_var2.json", "w"), indent=1)
    del caches, slots; torch.cuda.empty_cache()
