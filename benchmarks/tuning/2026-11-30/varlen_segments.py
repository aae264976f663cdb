"""SparseGDN on packed prompts of unequal lengths on the H200: the whole op at the Qwen3.5-4B GDN geometry for
cu_seqlens [0, 131072, 132096] (a 128K and a 1K prompt) and [0, 65536, 98304, 114688, 131072] (64K + 32K + 16K + 16K)
at several segment lengths, to choose the rule for unequal lengths (``None`` = the tree's default; the JSON records
what it resolves to). Each row's output against the first one's.

    PYTHONPATH=src python benchmarks/tuning/2026-11-30/varlen_segments.py   # JSON to $OUT/varlen_segments.json
"""
import json
import math
import os

import torch

from longsparse.bench.gdn import make_inputs
from longsparse.bench.timing import benchmark
from longsparse.ops.gdn import SparseGDNConfig, launch, sparse_chunk_gated_delta_rule

OUT = os.environ.get("OUT", ".")
CASES = {"128k+1k": [131072, 1024], "64k+32k+16k+16k": [65536, 32768, 16384, 16384]}
SEGMENTS = (None, 256, 342, 512, 684, 1024, 2048)
res = {"rows": []}
for name, lengths in CASES.items():
    T = sum(lengths)
    q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda", dtype=torch.int32)
    chunks = [-(-n // 64) for n in lengths]
    slots = launch.resident_programs(SparseGDNConfig().main_warps) * torch.cuda.get_device_properties(0).multi_processor_count
    width = 32 * (128 // SparseGDNConfig().block_v)
    pick = getattr(launch, "default_segment_length", None) or launch.segment_length
    res.setdefault("default", {})[name] = pick(chunks, width, slots)
    old = math.ceil(max(chunks) / math.ceil(2 * slots / width))
    res.setdefault("two_per_slot_rule", {})[name] = old + old % 2
    ref = None
    for seg in SEGMENTS + (old + old % 2,):
        cfg = SparseGDNConfig(segment_chunks=seg)

        def call(cfg=cfg):
            return sparse_chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, gate=gate, gate_norm_weight=w,
                                                 config=cfg, output_final_state=True)

        o, ht = call()
        ref = ref or (o, ht)
        row = {"case": name, "segment_chunks": seg,
               "o_vs_first_rel": ((o.float() - ref[0].float()).norm() / ref[0].float().norm()).item(),
               "ms": benchmark(call).median_ms}
        res["rows"].append(row)
        print(row, flush=True)
json.dump(res, open(os.path.join(OUT, "varlen_segments.json"), "w"), indent=1)
print(res["default"])
