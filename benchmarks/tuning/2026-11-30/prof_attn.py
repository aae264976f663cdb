"""Stage profile of the sparse_attn selectors / decode on the H200 (tuning sweep; JSON to $OUT/prof_attn.json)."""
import json, os, sys, time, traceback
import torch
from torch.profiler import profile, ProfilerActivity
from triton.testing import do_bench
import longsparse.ops.sparse_attn.select as S
from longsparse.ops.sparse_attn import (MINICPM4, compress_keys, forecast_select, infllmv2_select,
    forecast_select_decode, infllmv2_select_decode, sparse_decode, resident_slots, resident_block_table)
from longsparse.bench.attn import _smooth, _normal, _sdpa_decode

OUT = os.environ.get("OUT", ".")
res = {}
T0 = time.time()
def save():
    json.dump(res, open(f"{OUT}/prof_attn.json", "w"), indent=1)
def log(*a):
    print(f"[{time.time()-T0:6.1f}s]", *a, flush=True)

def kernels(fn, iters=5):
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        if t > 0:
            out[e.key[:70]] = round(t / iters, 2)
    return out

def graph_us(fn, rep=200):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay(); torch.cuda.synchronize()
    return do_bench(g.replay, warmup=20, rep=rep) * 1e3, out

def ms(fn):
    return do_bench(fn, warmup=20, rep=100)

def setvar(rows, warps):
    S.TOPK_ROWS, S.TOPK_WARPS = rows, warps

cfg = MINICPM4
dev = torch.device("cuda"); dt = torch.bfloat16
HQ, HKV, D = 32, 2, 128
which = sys.argv[1:] or ["prefill", "decode", "sdecode"]

if "prefill" in which:
  for B in (1, 4):
    T = 131072
    q = _smooth(B, T, HQ, D, device=dev, dtype=dt, seed=0)
    f = _smooth(B, T, HKV, D, device=dev, dtype=dt, seed=1)
    k = _normal(B, T, HKV, D, device=dev, dtype=dt, seed=2)
    k_cmp, _ = compress_keys(k, cfg.kernel_size, cfg.kernel_stride)
    del k
    key = f"prefill_B{B}"
    r = res[key] = {}
    setvar(1, None)
    base_f = forecast_select(f, k_cmp, cfg, tile_tokens=4)
    base_i = infllmv2_select(q, k_cmp, cfg)
    r["base_forecast_ms"] = ms(lambda: forecast_select(f, k_cmp, cfg, tile_tokens=4))
    r["base_infllmv2_ms"] = ms(lambda: infllmv2_select(q, k_cmp, cfg))
    r["base_forecast_kernels"] = kernels(lambda: forecast_select(f, k_cmp, cfg, tile_tokens=4), 3)
    r["base_infllmv2_kernels"] = kernels(lambda: infllmv2_select(q, k_cmp, cfg), 3)
    log(key, "base", r["base_forecast_ms"], r["base_infllmv2_ms"]); save()
    variants = [(1, 1), (1, 2), (1, 4), (2, 2)] if B == 1 else []
    for rows, warps in variants:
        for radix in (1, 8):
            if radix == 8:
                continue
            name = f"rows{rows}_w{warps}_r{radix}"
            try:
                setvar(rows, warps)
                sel = forecast_select(f, k_cmp, cfg, tile_tokens=4, topk_radix_bits=radix)
                same = torch.equal(sel.block_idx, base_f.block_idx) and torch.equal(sel.plan.blocks, base_f.plan.blocks) \
                    and torch.equal(sel.plan.token_bits, base_f.plan.token_bits)
                del sel
                t = ms(lambda: forecast_select(f, k_cmp, cfg, tile_tokens=4, topk_radix_bits=radix))
                r[name] = {"same": same, "forecast_ms": t}
                log(key, name, same, t); save()
            except Exception as e:
                r[name] = {"error": traceback.format_exc()[-600:]}
                log(key, name, "ERR", str(e)[:200])
    setvar(1, None)
    del q, f, k_cmp, base_f, base_i
    torch.cuda.empty_cache()

if "decode" in which:
  for B in (4, 1):
    T = 131072
    nb = cfg.num_blocks(T)
    k_cache = _normal(B, HKV, nb * cfg.block_size, D, device=dev, dtype=dt, seed=0)
    q = _normal(B, HQ, D, device=dev, dtype=dt, seed=2)
    f = _normal(B, HKV, D, device=dev, dtype=dt, seed=3)
    seqlens = torch.full((B,), T, dtype=torch.int32, device=dev)
    k_cmp, _ = compress_keys(k_cache.transpose(1, 2)[:, :T], cfg.kernel_size, cfg.kernel_stride)
    key = f"decode_B{B}"
    r = res[key] = {}
    setvar(1, None)
    base_f = forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T)
    base_i = infllmv2_select_decode(q, k_cmp, seqlens, cfg, max_seqlen=T)
    r["kernels_forecast"] = kernels(lambda: forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T), 20)
    r["kernels_infllmv2"] = kernels(lambda: infllmv2_select_decode(q, k_cmp, seqlens, cfg, max_seqlen=T), 20)
    for radix in (1, 8):
        for warps in (None, 1, 2, 4, 8, 16):
            if radix == 8 and warps in (1, 2, 4):
                continue
            name = f"r{radix}_w{warps}"
            try:
                setvar(1, warps)
                tf, of = graph_us(lambda: forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T, topk_radix_bits=radix))
                ti, oi = graph_us(lambda: infllmv2_select_decode(q, k_cmp, seqlens, cfg, max_seqlen=T, topk_radix_bits=radix))
                r[name] = {"forecast_us": tf, "infllmv2_us": ti, "same": torch.equal(of, base_f) and torch.equal(oi, base_i)}
                r[name]["kernels_forecast"] = kernels(lambda: forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T, topk_radix_bits=radix), 20)
                log(key, name, r[name]["forecast_us"], r[name]["infllmv2_us"], r[name]["same"]); save()
            except Exception as e:
                r[name] = {"error": traceback.format_exc()[-600:]}
                log(key, name, "ERR", str(e)[:200])
    setvar(1, None)
    del k_cache, k_cmp
    torch.cuda.empty_cache()

if "sdecode" in which:
  from torch.nn.attention import SDPBackend, sdpa_kernel
  for B in (4, 1):
    T = 131072
    nb = cfg.num_blocks(T)
    k_cache = _normal(B, HKV, nb * cfg.block_size, D, device=dev, dtype=dt, seed=0)
    v_cache = _normal(B, HKV, nb * cfg.block_size, D, device=dev, dtype=dt, seed=1)
    q = _normal(B, HQ, D, device=dev, dtype=dt, seed=2)
    f = _normal(B, HKV, D, device=dev, dtype=dt, seed=3)
    seqlens = torch.full((B,), T, dtype=torch.int32, device=dev)
    k_cmp, _ = compress_keys(k_cache.transpose(1, 2)[:, :T], cfg.kernel_size, cfg.kernel_stride)
    ids = forecast_select_decode(f, k_cmp, seqlens, cfg, max_seqlen=T)
    sk, sv = resident_slots(k_cache, cfg.block_size), resident_slots(v_cache, cfg.block_size)
    table = resident_block_table(ids, nb)
    key = f"sdecode_B{B}"
    r = res[key] = {}
    import longsparse.ops.sparse_attn.decode as DM
    DM.FUSE_MERGE = False
    ref = sparse_decode(q, sk, sv, table, ids, seqlens)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        r["dense_flash_us"], _ = graph_us(lambda: _sdpa_decode(q, k_cache, v_cache))
    import longsparse.ops.sparse_attn.decode as DM
    for fuse in (True, False):
      DM.FUSE_MERGE = fuse
      for ns in (None, 16, 24, 48, 64, 96):
        try:
            t, o = graph_us(lambda: sparse_decode(q, sk, sv, table, ids, seqlens, num_splits=ns))
            r[f"fuse{fuse}_splits{ns}"] = {"us": t, "maxdiff": (o.float() - ref.float()).abs().max().item()}
            log(key, fuse, ns, t)
        except Exception as e:
            r[f"fuse{fuse}_splits{ns}"] = {"error": traceback.format_exc()[-600:]}
      r[f"kernels_fuse{fuse}"] = kernels(lambda: sparse_decode(q, sk, sv, table, ids, seqlens), 20)
    DM.FUSE_MERGE = True
    save()
    del k_cache, v_cache
    torch.cuda.empty_cache()
log("done"); save()
