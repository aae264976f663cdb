"""Timing protocols for decode ops at 128K: one graph per call (zero-flush / read-flush / warm) vs N calls in one graph."""
import json, os, time
import torch
from triton.testing import do_bench
from longsparse.ops.sparse_attn import MINICPM4, compress_keys, forecast_select_decode, infllmv2_select_decode, resident_slots, resident_block_table, sparse_decode
from longsparse.bench.attn import _normal, _sdpa_decode
OUT = os.environ.get("OUT", "."); res = {}; T0 = time.time()
dev = torch.device("cuda"); dt = torch.bfloat16; HQ, HKV, D = 32, 2, 128; cfg = MINICPM4
junk = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device=dev); sink = torch.empty(1, device=dev)
def graph(fns):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for f in fns: f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns: f()
    g.replay(); torch.cuda.synchronize(); return g
def ev(call, pre, n=200):
    ts = []
    for _ in range(n):
        pre(); a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); call(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort(); return round(ts[len(ts) // 2], 2)
def protos(name, fns):
    g1 = graph(fns[:1]); gn = graph(fns)
    r = {"zero_flush": round(do_bench(g1.replay, warmup=20, rep=150) * 1e3, 2),
         "zero_flush_ev": ev(g1.replay, lambda: junk.zero_()),
         "read_flush_ev": ev(g1.replay, lambda: torch.sum(junk, out=sink) if False else junk.sum()),
         "warm_ev": ev(g1.replay, lambda: None),
         f"seq{len(fns)}_per_call": round(ev(gn.replay, lambda: None) / len(fns), 2),
         f"seq{len(fns)}_per_call_zero": round(ev(gn.replay, lambda: junk.zero_()) / len(fns), 2)}
    empty = graph([lambda: sink.add_(1)])
    r["empty_graph_ev"] = ev(empty.replay, lambda: None)
    print(f"[{time.time()-T0:.0f}s] {name} {r}", flush=True); return r
N = 8; T = 131072; nb = cfg.num_blocks(T)
for B in (4, 1):
    caches = [(_normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=10 * i), _normal(B, HKV, nb * 64, D, device=dev, dtype=dt, seed=10 * i + 1)) for i in range(N)]
    q = _normal(B, HQ, D, device=dev, dtype=dt, seed=2); f = _normal(B, HKV, D, device=dev, dtype=dt, seed=3)
    seqlens = torch.full((B,), T, dtype=torch.int32, device=dev)
    kcmps = [compress_keys(kc.transpose(1, 2), 32, 16)[0] for kc, _ in caches]
    ids = forecast_select_decode(f, kcmps[0], seqlens, cfg, max_seqlen=T); table = resident_block_table(ids, nb)
    slots = [(resident_slots(kc, 64), resident_slots(vc, 64)) for kc, vc in caches]
    r = res[f"B{B}"] = {}
    r["sparse_decode"] = protos(f"B{B} sparse", [lambda s=s: sparse_decode(q, s[0], s[1], table, ids, seqlens) for s in slots])
    r["forecast_select"] = protos(f"B{B} forecast", [lambda k=k: forecast_select_decode(f, k, seqlens, cfg, max_seqlen=T) for k in kcmps])
    r["infllmv2_select"] = protos(f"B{B} infllmv2", [lambda k=k: infllmv2_select_decode(q, k, seqlens, cfg, max_seqlen=T) for k in kcmps])
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
        r["dense_cudnn"] = protos(f"B{B} cudnn", [lambda c=c: _sdpa_decode(q, c[0], c[1]) for c in caches[:4]])
    json.dump(res, open(f"{OUT}/proto.json", "w"), indent=1)
    del caches, slots, kcmps; torch.cuda.empty_cache()
