"""The block selectors' top-k, every form side by side in one process on the H200 at MiniCPM4.1-8B geometry (32 Q /
2 KV heads, d = 128, bf16; budget 96 blocks, window 2048): the threshold search at 2 and 4 thresholds a pass
(``select.TOPK_ARITY``) and the bitonic top-k of 64-bit (score, block) keys (``select.TOPK_BITONIC``), each on 2, 4,
8 and 16 warps (``select.topk_warps`` replaced for the run); and, in decode, both run by the scoring kernel's last
program of each row instead of a launch of their own (``select.DECODE_FUSED_TOPK``, the caller's counters kept
across calls: ``fused_search4`` / ``fused_bitonic``, on the scoring kernel's 4 warps). Its search half is the grid of
the run prepared before it (the search's warps against its width), which it replaces.

Decode (T = 32K and 128K, B = 1 and 4): both selectors per call over 8 layers in one CUDA graph, as ``bench attn``
times them, and the top-k kernel's own device time (torch.profiler). Prefill (T = 128K, B = 1): both selectors.
Every form's block lists must equal the first form's (the default: search, 4 ways, 4 warps) on the same inputs
(``equal``).

    timeout 500 python3 benchmarks/tuning/next/topk_forms.py        # on the H200: $OUT/topk_forms.json
"""

import functools
import json
import os
import sys
import types

import torch

import longsparse.ops.sparse_attn.select as select_module
from longsparse.bench.attn import _layers_time, _normal
from longsparse.bench.timing import kernel_times
from longsparse.ops.sparse_attn import (
    SparseAttentionConfig,
    compress_keys,
    decode_topk_counters,
    forecast_select_decode,
    infllmv2_select_decode,
)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-04d"))
import topk_arity  # noqa: E402

HQ, HKV, D = 32, 2, 128
LAYERS = 8
ARGS = types.SimpleNamespace(warmup_ms=20.0, rep_ms=80.0)
FORMS = [("search", 4, 4)] + [
    (method, arity, warps)
    for method, arities in (("search", (2, 4)), ("bitonic", (0,)))
    for arity in arities
    for warps in (2, 4, 8, 16)
    if (method, arity, warps) != ("search", 4, 4)
]
"""(method, arity, warps); the first is the default and the others' reference."""
FUSED_FORMS = [("fused_search", 4, 4), ("fused_bitonic", 0, 4)]
"""Decode only: the top-k in the scoring kernel (its 4 warps)."""


def use_form(form) -> None:
    method, arity, warps = form
    select_module.TOPK_BITONIC = method.endswith("bitonic")
    select_module.TOPK_ARITY = arity or 4
    select_module.DECODE_FUSED_TOPK = method.startswith("fused")
    select_module.topk_warps = lambda nbp, w=warps: w


def form_name(form) -> str:
    method, arity, warps = form
    return f"{method}{arity or ''}_w{warps}"


def timed_forms(row: dict, calls: dict, unit: str, timer, profile=None, forms=FORMS) -> None:
    """Per form: each call's block lists (checked equal to the first form's) and time, into ``row``."""
    first = {}
    for form in forms:
        use_form(form)
        lists = {name: fns[0]() for name, fns in calls.items()}
        first = first or lists
        name = form_name(form)
        for call, fns in calls.items():
            row[f"{call}_{unit}_{name}"] = timer(fns)
        row[f"equal_{name}"] = all(torch.equal(lists[n], first[n]) for n in calls)
        if profile is not None:
            prof = kernel_times(profile)["kernels_us"]
            row[f"topk_kernel_us_{name}"] = sum(us for kernel, us in prof.items() if "topk" in kernel)
            row[f"kernels_us_{name}"] = prof  # every kernel of the call (the fused forms have no top-k kernel)


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
            counters = decode_topk_counters(B, HKV, device)  # one buffer for every call, as a model would keep it
            calls = {
                name: [functools.partial(fn, x, k, seqlens, cfg, max_seqlen=T, topk_counters=counters) for k in k_cmps]
                for name, fn, x in (("infllmv2", infllmv2_select_decode, q), ("forecast", forecast_select_decode, f))
            }
            row = {"phase": "decode", "T": T, "B": B, "blocks": cfg.num_blocks(T)}
            timed_forms(row, calls, "us", lambda fns: _layers_time(fns, device, ARGS).median_ms * 1e3,
                        profile=calls["forecast"][0], forms=FORMS + FUSED_FORMS)  # fmt: skip
            row["counters_zero"] = not counters.any().item()
            print(json.dumps(row), flush=True)
            rows.append(row)
            del k_cmps, calls
            torch.cuda.empty_cache()
    return rows


def prefill_row(cfg, device, T):
    """``../2026-12-04d/topk_arity.py``'s prefill case (both selectors at 128K, B = 1, smooth queries), timed over
    this script's forms."""
    topk_arity.timed_forms = timed_forms
    return topk_arity.prefill_row(cfg, device, T)


def main():
    device, cfg = torch.device("cuda"), SparseAttentionConfig()
    names = ("TOPK_BITONIC", "TOPK_ARITY", "DECODE_FUSED_TOPK", "topk_warps")
    defaults = {name: getattr(select_module, name) for name in names}
    rows = decode_rows(cfg, device, (32768, 131072)) + [prefill_row(cfg, device, 131072)]
    for name, value in defaults.items():
        setattr(select_module, name, value)
    out = os.path.join(os.environ.get("OUT", "."), "topk_forms.json")
    with open(out, "w") as fh:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        forms = [form_name(f) for f in FORMS + FUSED_FORMS]
        json.dump({**meta, "commit": os.environ.get("LONGSPARSE_GIT_COMMIT"), "forms": forms, "rows": rows}, fh,
                  indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
