"""Compile the transfer kernels (copy planner, persistent row copy) for sm_90 without a GPU and print their resource
usage and load widths at MiniCPM4.1-8B geometry (32 KiB rows, 128-entry selections, 94 dynamic slots).

Catches code-generation errors that Triton's CPU interpreter cannot see. Needs only the triton wheel:

    PYTHONPATH=src python scripts/compile_check_transfer.py
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).parent))

from compile_check_attn import compile_kernel  # noqa: E402

from longsparse.ops.transfer.kernels import copy, plan  # noqa: E402


def main() -> int:
    plan_types = {
        "sel_ptr": "*i32", "len_ptr": "*i32", "seq_ptr": "*i64", "res_ptr": "*i32", "tbl_ptr": "*i32",
        "src_ptr": "*i64", "dst_ptr": "*i64", "cnt_ptr": "*i32", "stats_ptr": "*i64",
        "host_seq_stride": "i32", "host_head_stride": "i32", "host_offset": "i32", "gpu_offset": "i32", "W": "i32",
    }  # fmt: skip
    plan_consts = dict(HKV=2, WP=128, C=94, CP=128, BLOCK=64, INIT=1, LOCAL=32)
    for warps in (4, 8):
        compile_kernel(f"plan W128 C94 warps{warps}", plan.plan_fwd_kernel_slots, plan_consts, plan_types, warps, 1)
    copy_types = {"src_ptr": "*i32", "dst_ptr": "*i32", "src_rows_ptr": "*i64", "dst_rows_ptr": "*i64",
                  "cnt_ptr": "*i32"}  # fmt: skip
    for ctas in (16, 32):
        fields = compile_kernel(
            f"copy 32KiB rows, {ctas} CTAs", copy.copy_fwd_kernel_rows, dict(ROW=8192, CHUNK=8192, NCTA=ctas),
            copy_types, 8, 1,
        )  # fmt: skip
    return 0 if fields and not re.search(r"[1-9]", fields.get("LOCAL", "0")) else 1


if __name__ == "__main__":
    sys.exit(main())
