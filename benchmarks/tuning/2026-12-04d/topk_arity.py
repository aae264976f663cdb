"""The block selectors' top-k with its threshold searched ``TOPK_ARITY`` ways per pass (2: the binary search, the
default until this run; 4, 8, 16), side by side in one process on the H200 at MiniCPM4.1-8B geometry (32 Q / 2 KV
heads, d = 128, bf16; the bench's defaults: budget 96 blocks, window 2048). The harness is
``../2026-12-04b/topk_radix.py``'s, with the form switched by ``select.TOPK_ARITY``.

Decode (T = 32K and 128K, B = 1 and 4): both selectors per call over 8 layers in one CUDA graph, as ``bench attn``
times them, and the top-k kernel's own device time. Prefill (T = 128K, B = 1): both selectors, ``do_bench``. Every
form's block lists must equal the binary search's on the same inputs (``equal_<arity>``).

    timeout 300 python3 benchmarks/tuning/2026-12-04d/topk_arity.py        # on the H200: $OUT/topk_arity.json
"""

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

FORMS = (2, 4, 8, 16)
HQ, HKV, D = 32, 2, 128
LAYERS = 8
ARGS = types.SimpleNamespace(warmup_ms=20.0, rep_ms=80.0)


def timed_forms(row: dict, calls: dict, unit: str, timer) -> None:
    """Per form: each call's block lists (checked equal to the binary search's) and time, into ``row``."""
    first = {}
    for arity in FORMS:
        select_module.TOPK_ARITY = arity
        lists = {name: fns[0]() for name, fns in calls.items()}
        first = first or lists
        for name, fns in calls.items():
            row[f"{name}_{unit}_{arity}"] = timer(fns)
        row[f"equal_{arity}"] = all(torch.equal(lists[n], first[n]) for n in calls)
    select_module.TOPK_ARITY = 2


def decode_rows(cfg, device, lengths):
    rows = []
    for T in lengths:
        for B in (1, 4):
            k_cmps = []
            for layer in range(LAYERS):
                k = _normal(B, T, HKV, D, device=device, dtype=torch.bfloat16, seed=100 * layer + B)
                k_cmps.append(compress_keys(k, cfg.kernel_size, cfg.kernel_stride)[0])
                del k
            q = _normal(B, HQ, D, device=device, dtype=torch.bfloat16, seed=1)
            f = _normal(B, HKV, D, device=device, dtype=torch.bfloat16, seed=2)
            seqlens = torch.full((B,), T, dtype=torch.int32, device=device)
            calls = {
                name: [functools.partial(fn, x, k, seqlens, cfg, max_seqlen=T) for k in k_cmps]
                for name, fn, x in (("infllmv2", infllmv2_select_decode, q), ("forecast", forecast_select_decode, f))
            }
            row = {"phase": "decode", "T": T, "B": B, "blocks": cfg.num_blocks(T)}
            timed_forms(row, calls, "us", lambda fns: _layers_time(fns, device, ARGS).median_ms * 1e3)
            for arity in FORMS:
                row[f"ratio_{arity}"] = row[f"infllmv2_us_{arity}"] / row[f"forecast_us_{arity}"]
                select_module.TOPK_ARITY = arity
                prof = kernel_times(calls["forecast"][0])["kernels_us"]
                row[f"topk_kernel_us_{arity}"] = sum(us for name, us in prof.items() if "topk" in name)
            select_module.TOPK_ARITY = 2
            print(json.dumps(row), flush=True)
            rows.append(row)
            del k_cmps, calls
            torch.cuda.empty_cache()
    return rows


def prefill_row(cfg, device, T):
    q = _smooth(1, T, HQ, D, device=device, dtype=torch.bfloat16, seed=3)
    f = _smooth(1, T, HKV, D, device=device, dtype=torch.bfloat16, seed=4)
    k_cmp = compress_keys(_normal(1, T, HKV, D, device=device, dtype=torch.bfloat16, seed=5), cfg.kernel_size,
                          cfg.kernel_stride)[0]  # fmt: skip
    calls = {
        "infllmv2": [lambda: infllmv2_select(q, k_cmp, cfg).block_idx],
        "forecast": [lambda: forecast_select(f, k_cmp, cfg).block_idx],
    }
    row = {"phase": "prefill", "T": T, "B": 1}
    timed_forms(row, calls, "ms", lambda fns: _time(fns[0], device, ARGS).median_ms)
    print(json.dumps(row), flush=True)
    return row


def main():
    device, cfg = torch.device("cuda"), SparseAttentionConfig()
    rows = decode_rows(cfg, device, (32768, 131072)) + [prefill_row(cfg, device, 131072)]
    out = os.path.join(os.environ.get("OUT", "."), "topk_arity.json")
    with open(out, "w") as fh:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        json.dump({**meta, "commit": os.environ.get("LONGSPARSE_GIT_COMMIT"), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
