"""Run on the H200 on 2026-12-04 against commit b71dd6c, the last with the radix form (removed after this run; records
in this folder's README): the block selectors' top-k with its threshold found by the binary search
(``TOPK_RADIX_BITS = 0``, the default) or by the radix select (4 or 8 bits a digit), side by side in one process at
MiniCPM4.1-8B geometry (32 Q / 2 KV heads, d = 128, bf16, the bench's defaults: budget 96 blocks, window 2048).

Decode (T = 32K and 128K, B = 1 and 4): both selectors per call over 8 layers in one CUDA graph, as ``bench attn``
times them, plus the top-k kernel's own device time. Prefill (T = 128K, B = 1): both selectors, ``do_bench``.
Every form's block lists must equal the binary search's on the same inputs (``*_equal``); the decode target of
issue #5 is ``infllmv2_us / forecast_us >= 2.0`` at 128K and B = 4 (``bench attn``'s ``select_speedup_decode_128k``,
1.36 on 2026-11-30 with the binary search, whose top-k took 9.4 µs of the Forecast's ~15).

    timeout 300 python3 benchmarks/tuning/2026-12-04b/topk_radix.py        # on the H200: $OUT/topk_radix.json
    python3 benchmarks/tuning/2026-12-04b/topk_radix.py --tiny             # a CPU smoke run (interpreter, tiny shapes)
"""

import argparse
import functools
import json
import os
import types

import torch

import longsparse.ops.sparse_attn.select as select_module
from longsparse.bench.attn import _layers_time, _normal, _smooth, _time
from longsparse.bench.timing import kernel_times
from longsparse.ops.sparse_attn import (
    SparseAttentionConfig,
    compress_keys,
    forecast_select,
    forecast_select_decode,
    infllmv2_select,
    infllmv2_select_decode,
)

FORMS = (0, 4, 8)
HQ, HKV, D = 32, 2, 128
LAYERS = 8
ARGS = types.SimpleNamespace(warmup_ms=20.0, rep_ms=80.0)


def decode_rows(cfg, device, lengths):
    rows = []
    for T in lengths:
        for B in (1, 4):
            nb = cfg.num_blocks(T)
            k_cmps = []
            for layer in range(LAYERS):
                k = _normal(B, T, HKV, D, device=device, dtype=torch.bfloat16, seed=100 * layer + B)
                k_cmps.append(compress_keys(k, cfg.kernel_size, cfg.kernel_stride)[0])
                del k
            q = _normal(B, HQ, D, device=device, dtype=torch.bfloat16, seed=1)
            f = _normal(B, HKV, D, device=device, dtype=torch.bfloat16, seed=2)
            seqlens = torch.full((B,), T, dtype=torch.int32, device=device)
            row = {"phase": "decode", "T": T, "B": B, "blocks": nb}
            lists = {}
            inf = [functools.partial(infllmv2_select_decode, q, k, seqlens, cfg, max_seqlen=T) for k in k_cmps]
            fc = [functools.partial(forecast_select_decode, f, k, seqlens, cfg, max_seqlen=T) for k in k_cmps]
            for bits in FORMS:
                select_module.TOPK_RADIX_BITS = bits
                lists[bits] = (inf[0](), fc[0]())
                row[f"infllmv2_us_{bits}"] = _layers_time(inf, device, ARGS).median_ms * 1e3
                row[f"forecast_us_{bits}"] = _layers_time(fc, device, ARGS).median_ms * 1e3
                row[f"ratio_{bits}"] = row[f"infllmv2_us_{bits}"] / row[f"forecast_us_{bits}"]
                prof = kernel_times(fc[0])["kernels_us"]
                row[f"topk_kernel_us_{bits}"] = sum(us for name, us in prof.items() if "topk" in name)
                row[f"forecast_kernels_us_{bits}"] = prof
                if bits:
                    row[f"equal_{bits}"] = all(torch.equal(a, b) for a, b in zip(lists[bits], lists[0]))
            select_module.TOPK_RADIX_BITS = 0
            print(json.dumps(row), flush=True)
            rows.append(row)
            del k_cmps, inf, fc
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def prefill_rows(cfg, device, T):
    B = 1
    q = _smooth(B, T, HQ, D, device=device, dtype=torch.bfloat16, seed=3)
    f = _smooth(B, T, HKV, D, device=device, dtype=torch.bfloat16, seed=4)
    k = _normal(B, T, HKV, D, device=device, dtype=torch.bfloat16, seed=5)
    k_cmp = compress_keys(k, cfg.kernel_size, cfg.kernel_stride)[0]
    row = {"phase": "prefill", "T": T, "B": B}
    lists = {}
    for bits in FORMS:
        select_module.TOPK_RADIX_BITS = bits
        lists[bits] = (infllmv2_select(q, k_cmp, cfg).block_idx, forecast_select(f, k_cmp, cfg).block_idx)
        row[f"infllmv2_ms_{bits}"] = _time(lambda: infllmv2_select(q, k_cmp, cfg), device, ARGS).median_ms
        row[f"forecast_ms_{bits}"] = _time(lambda: forecast_select(f, k_cmp, cfg), device, ARGS).median_ms
        if bits:
            row[f"equal_{bits}"] = all(torch.equal(a, b) for a, b in zip(lists[bits], lists[0]))
    select_module.TOPK_RADIX_BITS = 0
    print(json.dumps(row), flush=True)
    return [row]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: T = 320, a scaled-down config")
    args = parser.parse_args()
    if args.tiny:
        global HQ, HKV, D, LAYERS
        HQ, HKV, D, LAYERS = 4, 2, 32, 1
        device = torch.device("cpu")
        cfg = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=4, kernel_size=8, kernel_stride=4,
                                    dense_len=0)  # fmt: skip
        ARGS.warmup_ms, ARGS.rep_ms = 0.0, 0.0
        lengths = (320,)
    else:
        device, cfg, lengths = torch.device("cuda"), SparseAttentionConfig(), (32768, 131072)
    rows = decode_rows(cfg, device, lengths) + prefill_rows(cfg, device, lengths[-1])
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    out = os.path.join(os.environ.get("OUT", "."), "topk_radix.json")
    with open(out, "w") as fh:
        json.dump({"device": name, "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
