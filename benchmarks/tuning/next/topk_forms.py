"""The block selectors' top-k forms that decide the default, side by side in one process on the H200 at MiniCPM4.1-8B
geometry (32 Q / 2 KV heads, d = 128, bf16; budget 96 blocks, window 2048): the threshold search at the default
arity (``SelectKernelConfig.topk_arity``, 4 ways) and the bitonic top-k of 64-bit (score, block) keys
(``topk_bitonic``), each on the default warps (``select.topk_warps``) and on twice as many (``topk_warps_scale``);
and, in decode, both run by the scoring kernel's last program of each row instead of a launch of their own
(``decode_fused_topk``, the caller's counters kept across calls: ``fused_search`` / ``fused_bitonic``, on the scoring
kernel's 4 warps). It trims the sweep prepared before it (2 and 4 ways, 2-16 warps) to the question the default turns
on.

Decode (T = 32K and 128K, B = 1 and 4): both selectors per call over 8 layers in one CUDA graph, as ``bench attn``
times them, and the top-k kernel's own device time (torch.profiler, Forecast). Prefill (T = 128K, B = 1): both
selectors. Every form's block lists must equal the first form's (the default) on the same inputs (``equal_<form>``);
a form that selects differently is reported, not timed as a candidate.

A form is a :class:`SelectKernelConfig` (:func:`form_config`), passed to every selector call as ``kernel_config=``.

    timeout 200 python3 benchmarks/tuning/next/topk_forms.py            # on the H200 (~2-3 min): $OUT/topk_forms.json
    TRITON_INTERPRET=1 python3 benchmarks/tuning/next/topk_forms.py --dry-run   # any CPU: the script's logic, tiny
"""

import argparse
import dataclasses
import functools
import json
import os
import time
import types

import torch

from longsparse.bench.attn import _layers_time, _normal, _smooth, _time
from longsparse.bench.timing import kernel_times
from longsparse.ops.sparse_attn import (
    SelectKernelConfig,
    SparseAttentionConfig,
    compress_keys,
    decode_topk_counters,
    forecast_select,
    forecast_select_decode,
    infllmv2_select,
    infllmv2_select_decode,
)

HEADS = (32, 2, 128)
"""Query heads, KV heads, head dim: MiniCPM4.1-8B's attention (``--dry-run``: :data:`DRY_HEADS`)."""
DRY_HEADS = (4, 2, 32)
LAYERS = 8
ARGS = types.SimpleNamespace(warmup_ms=20.0, rep_ms=80.0)
DRY_CONFIG = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=4, kernel_size=16, kernel_stride=8,
                                   dense_len=64)  # fmt: skip
"""``--dry-run``'s block geometry: the real one's logic at interpreter sizes (prompts of 64+ tokens are sparse)."""


@dataclasses.dataclass(frozen=True)
class Form:
    """One top-k form: ``method`` "search" (threshold search at :data:`ARITY` thresholds a pass) or "bitonic";
    ``warps_factor`` times the default warps of the top-k kernel (``select.topk_warps``); ``fused``: decode's top-k
    run by the scoring kernel (its own warps; decode only)."""

    method: str
    warps_factor: int = 1
    fused: bool = False

    @property
    def name(self) -> str:
        base = f"fused_{self.method}" if self.fused else self.method
        return base if self.warps_factor == 1 else f"{base}_w{self.warps_factor}x"


ARITY = SelectKernelConfig.topk_arity
"""The threshold search's thresholds per pass: the default."""
FORMS = [Form("search"), Form("search", 2), Form("bitonic"), Form("bitonic", 2)]
"""Prefill and decode forms; the first is the default and the others' reference."""
FUSED_FORMS = [Form("search", fused=True), Form("bitonic", fused=True)]
"""Decode only."""


def form_config(form: Form) -> SelectKernelConfig:
    """The selectors' kernel config of ``form`` (the one place a form is chosen)."""
    return SelectKernelConfig(
        topk_arity=ARITY,
        topk_bitonic=form.method == "bitonic",
        topk_warps_scale=form.warps_factor,
        decode_fused_topk=form.fused,
    )


def timed_forms(row: dict, calls: dict, unit: str, timer, forms, profile=None) -> None:
    """Per form: each call's block lists (checked equal to the first form's) and time, into ``row``. ``calls`` maps
    a name to functions of ``kernel_config`` (one per layer); ``profile``: such a function whose kernels are
    profiled."""
    first = {}
    for form in forms:
        config = form_config(form)
        bound = {name: [functools.partial(fn, kernel_config=config) for fn in fns] for name, fns in calls.items()}
        lists = {name: fns[0]() for name, fns in bound.items()}
        first = first or lists
        row[f"equal_{form.name}"] = all(torch.equal(lists[n], first[n]) for n in calls)
        for call, fns in bound.items():
            row[f"{call}_{unit}_{form.name}"] = timer(fns)
        if profile is not None:
            prof = kernel_times(functools.partial(profile, kernel_config=config))["kernels_us"]
            row[f"topk_kernel_us_{form.name}"] = sum(us for kernel, us in prof.items() if "topk" in kernel)
            row[f"kernels_us_{form.name}"] = prof  # every kernel of the call (the fused forms have no top-k kernel)


def decode_rows(cfg, heads, device, dtype, lengths, batches, timer, profile):
    HQ, HKV, D = heads
    rows = []
    for T in lengths:
        for B in batches:
            k_cmps = []
            for layer in range(LAYERS):
                k = _normal(B, T, HKV, D, device=device, dtype=dtype, seed=100 * layer + B)
                k_cmps.append(compress_keys(k, cfg.kernel_size, cfg.kernel_stride)[0])
                del k
            q = _normal(B, HQ, D, device=device, dtype=dtype, seed=1)
            f = _normal(B, HKV, D, device=device, dtype=dtype, seed=2)
            seqlens = torch.full((B,), T, dtype=torch.int32, device=device)
            counters = decode_topk_counters(B, HKV, device)  # one buffer for every call, as a model would keep it
            kw = dict(max_seqlen=T, topk_counters=counters, use_kernel=True)
            calls = {
                name: [functools.partial(fn, x, k, seqlens, cfg, **kw) for k in k_cmps]
                for name, fn, x in (("infllmv2", infllmv2_select_decode, q), ("forecast", forecast_select_decode, f))
            }
            row = {"phase": "decode", "T": T, "B": B, "blocks": cfg.num_blocks(T)}
            timed_forms(row, calls, "us", lambda fns: None if (ms := timer(fns)) is None else ms * 1e3,
                        FORMS + FUSED_FORMS, profile=calls["forecast"][0] if profile else None)  # fmt: skip
            row["counters_zero"] = not counters.any().item()
            print(json.dumps(row), flush=True)
            rows.append(row)
            del k_cmps, calls
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def prefill_row(cfg, heads, device, dtype, T, timer, forms=FORMS, selectors=("infllmv2", "forecast")):
    """``selectors`` at ``T`` tokens, B = 1, on smooth queries (neighbouring tokens choose overlapping blocks)."""
    HQ, HKV, D = heads
    q = _smooth(1, T, HQ, D, device=device, dtype=dtype, seed=3)
    f = _smooth(1, T, HKV, D, device=device, dtype=dtype, seed=4)
    k_cmp = compress_keys(_normal(1, T, HKV, D, device=device, dtype=dtype, seed=5), cfg.kernel_size,
                          cfg.kernel_stride)[0]  # fmt: skip
    calls = {
        "infllmv2": [
            lambda kernel_config: infllmv2_select(q, k_cmp, cfg, use_kernel=True, kernel_config=kernel_config).block_idx
        ],
        "forecast": [
            lambda kernel_config: forecast_select(f, k_cmp, cfg, use_kernel=True, kernel_config=kernel_config).block_idx
        ],
    }
    row = {"phase": "prefill", "T": T, "B": 1}
    timed_forms(row, {name: calls[name] for name in selectors}, "ms", timer, forms)
    print(json.dumps(row), flush=True)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny geometry (4 / 2 heads of 32; decode 517 tokens at B = 3, prefill 80 with the "
                        "Forecast selector), float32, nothing timed: checks the script and the forms' block lists on "
                        "any machine (TRITON_INTERPRET=1 without a GPU)")  # fmt: skip
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    if args.dry_run:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        cfg, heads, dtype = DRY_CONFIG, DRY_HEADS, torch.float32
        decode_lengths, batches, prefill_length = (517,), (3,), 80
        # the interpreter runs a prefill selection in about a minute: one selector, one form of each method
        prefill = dict(forms=[FORMS[0], FORMS[2]], selectors=("forecast",))

        def timer(fns):
            return None  # nothing timed off the GPU: the dry run checks what each form selects

        profile = False
    else:
        device, cfg, heads, dtype = torch.device("cuda"), SparseAttentionConfig(), HEADS, torch.bfloat16
        decode_lengths, batches, prefill_length = (32768, 131072), (1, 4), 131072
        prefill = {}

        def timer(fns):
            return _layers_time(fns, device, ARGS).median_ms if len(fns) > 1 else _time(fns[0], device, ARGS).median_ms

        profile = True
    rows = decode_rows(cfg, heads, device, dtype, decode_lengths, batches, timer, profile)
    rows.append(prefill_row(cfg, heads, device, dtype, prefill_length, timer, **prefill))
    forms = [f.name for f in FORMS + FUSED_FORMS]
    unequal = sorted({k.removeprefix("equal_") for r in rows for k, v in r.items() if k.startswith("equal_") and not v})
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run: no timing)",
            "torch": torch.__version__, "commit": os.environ.get("LONGSPARSE_GIT_COMMIT"), "dry_run": args.dry_run,
            "arity": ARITY, "forms": forms, "forms_selecting_differently": unequal,
            "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    out = os.path.join(os.environ.get("OUT", "."), "topk_forms.json")
    with open(out, "w") as fh:
        json.dump({**meta, "rows": rows}, fh, indent=1)
    print(f"wrote {out}: {len(rows)} rows, {meta['seconds']} s; forms selecting differently: {unequal or 'none'}")
    return 1 if unequal else 0


if __name__ == "__main__":
    raise SystemExit(main())
