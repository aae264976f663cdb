"""Prepared for the next device session: the top-k's warps against its search width. The four-way search (the
default since 2026-12-04) compares every key four times a pass, so the 4 warps the binary search was tuned on
(``select.topk_warps``: ~512 blocks a warp) may no longer be best. ``../2026-12-04d/topk_arity.py``'s harness, run
once per warp count (``select.topk_warps`` replaced for the run) with arities 2 and 4: decode at 32K and 128K, B = 1
and 4 (8 layers in one CUDA graph, as ``bench attn`` times them), and prefill at 128K, B = 1. Every form's block
lists must equal the binary search's (``equal_<arity>``).

    timeout 400 python3 benchmarks/tuning/next/topk_warps_arity.py     # on the H200: $OUT/topk_warps_arity.json
"""

import json
import os
import sys

import torch

import longsparse.ops.sparse_attn.select as select_module
from longsparse.ops.sparse_attn import SparseAttentionConfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-04d"))
import topk_arity  # noqa: E402

WARPS = (2, 4, 8, 16)


def main():
    device, cfg = torch.device("cuda"), SparseAttentionConfig()
    topk_arity.FORMS = (2, 4)
    default = select_module.topk_warps
    rows = []
    for warps in WARPS:
        select_module.topk_warps = lambda nbp, w=warps: w
        for row in topk_arity.decode_rows(cfg, device, (32768, 131072)) + [topk_arity.prefill_row(cfg, device, 131072)]:
            rows.append({"warps": warps, **row})
    select_module.topk_warps = default
    out = os.path.join(os.environ.get("OUT", "."), "topk_warps_arity.json")
    with open(out, "w") as fh:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        json.dump({**meta, "commit": os.environ.get("LONGSPARSE_GIT_COMMIT"), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
