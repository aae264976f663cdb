"""The three-launch GPU selector's work split and ranking method (``select.SelectorBlocks``) at 4K-128K tokens
(B = 1, Qwen3.5-4B GDN geometry: 32 value heads in 16 pairs, a bf16 output gate of width 128).

Device µs per kernel (torch.profiler, 10 calls) of ``select_events_gpu(details=False)`` with the decay prefix, for
each split; every split's mask against the default's (they must be equal). Inputs: random tail scores and chunk
decays (the selector's work does not depend on their values). The one-launch selector beside them at 4K and 8K, in
4, 8 and 16 warps.

    timeout 200 python3 benchmarks/tuning/2026-12-03b/selector_blocks.py   # on the H200; $OUT/selector_blocks.json
"""

import itertools
import json
import os

import torch

from longsparse.bench.timing import kernel_times
from longsparse.ops.gdn import SparseGDNConfig
from longsparse.ops.gdn import select as gpu_select
from longsparse.ops.gdn.spec.layout import build_layout

HV, G, V = 32, 2, 128
LENGTHS = (4096, 8192, 32768, 131072)
SPLITS = [  # sort_max 1: bisection at every length; 8192: a sort at every length
    gpu_select.SelectorBlocks(sort_max=sort_max, rank_warps=warps)
    for sort_max, warps in itertools.product((1024, 1, 8192), (1, 2, 4, 8))
]


def length(T: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(T)
    layout = build_layout(1, T, None, "cuda")
    score = torch.rand(layout.NC, HV, device="cuda", generator=gen)
    gamma = -torch.rand(layout.NC, HV, device="cuda", generator=gen)
    gate = torch.randn(1, T, HV, V, device="cuda", generator=gen).bfloat16()
    w = 0.5 + torch.rand(V, device="cuda", generator=gen)
    prefix = torch.empty(layout.NC, HV, dtype=torch.float64, device="cuda")
    config = SparseGDNConfig()

    def call(**kw):
        return lambda: gpu_select.select_events_gpu(
            layout, score, gamma, G, config, gate, w, details=False, decay_prefix=prefix, **kw
        )

    want = call(short=False)().mask.clone()
    out = {}
    forms = {str(split): dict(short=False, blocks=split) for split in SPLITS}
    if layout.Cmax <= gpu_select.SHORT_CHUNKS:
        for warps in (4, 8, 16):
            forms[f"one-launch-{warps}-warps"] = dict(short=True, blocks=gpu_select.SelectorBlocks(short_warps=warps))
    for name, kw in forms.items():
        fn = call(**kw)
        out[name] = kernel_times(fn, width=60)
        out[name]["mask_equal"] = bool(torch.equal(fn().mask, want))
    return out


def main():
    result = {}
    for T in LENGTHS:
        result[T] = length(T)
        best = sorted(result[T].items(), key=lambda kv: kv[1]["sum_us"])[:4]
        print(T, [(name, r["sum_us"], r["mask_equal"]) for name, r in best], flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "selector_blocks.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
