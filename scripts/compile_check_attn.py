"""Compile every sparse-attention Triton kernel for sm_90 without a GPU and print its resource usage.

Catches code-generation errors that Triton's CPU interpreter cannot see, and shows registers, spills (local
memory) and shared memory per kernel at MiniCPM4.1-8B geometry (bf16, d = 128, G = 16, block 64, 32/16 compression,
T = 128K), and the block-sparse prefill at Qwen3.5's (d = 256, G = 4). Needs only the triton wheel (it ships ptxas
and cuobjdump):

    PYTHONPATH=src python scripts/compile_check_attn.py
    PYTHONPATH=src python scripts/compile_check_attn.py --only "prefill attention"   # kernels whose label has this
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from longsparse.ops.sparse_attn.config import SelectKernelConfig
from longsparse.ops.sparse_attn.kernels import compress, decode, prefill, select
from longsparse.ops.sparse_attn.prefill import prefill_num_stages, prefill_num_warps
from longsparse.ops.sparse_attn.select import topk_warps

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv[:-1] else ""
TOPK = SelectKernelConfig()  # the launchers' default form


def _signature(fn, types: dict, consts: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = types.get(name, "*bf16")
        else:
            sig[name] = types.get(name, "i32")
    return sig


def compile_kernel(label: str, fn, consts: dict, types: dict | None = None, num_warps: int = 4, num_stages: int = 3):
    if ONLY not in label:
        return {}
    # As Triton's launcher specialises them at run time: pointers and strides (multiples of 16 elements at this
    # geometry) are marked 16-divisible, which is what lets loads become 16-byte vectors.
    sig = _signature(fn, types or {}, consts)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if sig[name] != "constexpr" and (name.endswith("_ptr") or name.startswith("stride_"))
    }
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", f.name], capture_output=True, text=True)
    line = next((ln for ln in usage.stdout.splitlines() if "REG:" in ln), usage.stdout.strip())
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line))
    ptx = compiled.asm["ptx"]
    mma = "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else "no mma")
    wide = len(re.findall(r"(ld\.global[.a-z]*\.v4|cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], 0x10)", ptx))
    narrow = len(
        re.findall(r"ld\.global[.a-z]*\.b16|cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], 0x[24]\b", ptx)
    )
    print(
        f"{label:<34} regs {fields.get('REG', '?'):>4}  stack {fields.get('STACK', '?'):>5}  "
        f"local {fields.get('LOCAL', '?'):>5}  shared {int(compiled.metadata.shared):>6}  warps {num_warps}  {mma:<8}"
        f"  16B loads {wide:>3}  2/4B loads {narrow:>3}"
    )
    return fields


# fmt: off
def main() -> int:
    f32 = {"scale_log2": "fp32"}
    geo = dict(HKV=2, D=128, BD=128)
    grid = dict(KS=32, ST=16, P=4)
    forced = dict(BLOCK=64, INIT=1, LOCAL=32)
    i32 = {name: "*i32" for name in ("len_ptr", "idx_ptr", "pblk_ptr", "pbits_ptr", "pcnt_ptr", "tbl_ptr", "ids_ptr",
                                    "cnt_ptr")}
    f32p = {name: "*fp32" for name in ("s_ptr", "m_ptr", "l_ptr", "acc_ptr")}
    types = {**f32, **i32, **f32p}

    compile_kernel("compress prefill", compress.compress_fwd_kernel_prefill,
                   dict(H=2, D=128, KS=32, ST=16, BJ=16, BD=128))
    compile_kernel("compress decode", compress.compress_fwd_kernel_decode, dict(H=2, D=128, KS=32, ST=16, BD=128),
                   types, num_warps=1)
    for name, G, bt, soft, warps in (("infllmv2", 16, 8, True, 8), ("forecast", 1, 64, False, 4)):
        consts = dict(G=G, GP=G, BT=bt, BN=16, R1=1, SOFTMAX=soft, DOT_PRECISION="tf32", BM=bt * G, BNC=64)
        compile_kernel(f"scores prefill {name}", select.select_fwd_kernel_scores, {**geo, **grid, **forced, **consts},
                       types, num_warps=warps)
    qwen_geo = dict(HKV=4, D=256, BD=256)
    for name, G, bt, soft, warps in (("infllmv2", 4, 32, True, 8), ("forecast", 1, 64, False, 4)):
        consts = dict(G=G, GP=G, BT=bt, BN=16, R1=1, SOFTMAX=soft, DOT_PRECISION="tf32", BM=bt * G, BNC=64)
        compile_kernel(f"scores prefill {name}, Qwen3.5", select.select_fwd_kernel_scores,
                       {**qwen_geo, **grid, **forced, **consts}, types, num_warps=warps)
    dec = dict(GP=16, CB=32, BN=16, DOT_PRECISION="tf32", BNC=64)
    compile_kernel("decode lse infllmv2", select.select_fwd_kernel_decode_lse, {**geo, **grid, **dec, "G": 16}, types)
    unfused = dict(FUSE_TOPK=False, NBP=1, S=1, SP=1, BUDGET=1, ARITY=2, BITONIC=False, KP=1)
    for name, G, soft in (("infllmv2", 16, True), ("forecast", 1, False)):
        consts = {**geo, **grid, **forced, **dec, "G": G, "R1": 1, "DENSE_LEN": 8192, "SOFTMAX": soft, **unfused}
        compile_kernel(f"decode scores {name}", select.select_fwd_kernel_decode_scores, consts, types)
        for form, bitonic in (("search", False), ("bitonic", True)):  # with the top-k fused (decode_fused_topk)
            fused = dict(FUSE_TOPK=True, NBP=2048, S=128, SP=128, BUDGET=96, ARITY=TOPK.topk_arity, BITONIC=bitonic,
                         KP=128)
            compile_kernel(f"decode scores {name}, fused top-k ({form})", select.select_fwd_kernel_decode_scores,
                           {**consts, **fused}, types)  # fmt: skip
    topk = dict(HKV=2, NBP=2048, SP=128, BUDGET=96, DENSE_LEN=8192, ARITY=TOPK.topk_arity, BITONIC=False, KP=128,
                **forced)
    for bt, u, up in ((4, 384, 512), (16, 1024, 1024)):  # MiniCPM4's tile (G = 16) and Qwen3.5's (G = 4)
        compile_kernel(f"topk prefill (T=128K, tile {bt})", select.select_fwd_kernel_topk,
                       dict(topk, BT=bt, S=96, U=u, UP=up, DECODE=False, WRITE_PLAN=True, SUB=TOPK.topk_rows), types,
                       num_warps=topk_warps(2048))
    for arity in sorted({TOPK.topk_arity, 2, 4, 8, 16}):  # the default and the other search widths
        compile_kernel(f"topk decode (T=128K, arity {arity})", select.select_fwd_kernel_topk,
                       dict(topk, BT=1, S=128, U=1, UP=1, DECODE=True, WRITE_PLAN=False, SUB=1, ARITY=arity), types,
                       num_warps=topk_warps(2048))
    for warps in (4, 8):  # the bitonic top-k (topk_bitonic)
        compile_kernel(f"topk decode (T=128K, bitonic, {warps} warps)", select.select_fwd_kernel_topk,
                       dict(topk, BT=1, S=128, U=1, UP=1, DECODE=True, WRITE_PLAN=False, SUB=1, BITONIC=True),
                       types, num_warps=warps)  # fmt: skip
        compile_kernel(f"topk prefill (T=128K, tile 4, bitonic, {warps} warps)", select.select_fwd_kernel_topk,
                       dict(topk, BT=4, S=96, U=384, UP=512, DECODE=False, WRITE_PLAN=True, SUB=TOPK.topk_rows,
                            BITONIC=True), types, num_warps=warps)  # fmt: skip
    for bt in (4, 8):
        consts = {**geo, "G": 16, "GP": 16, "BT": bt, "BLOCK": 64, "DOT_PRECISION": "tf32", "BM": bt * 16}
        compile_kernel(f"prefill attention (tile {bt})", prefill.prefill_fwd_kernel_attn, consts, types,
                       num_warps=prefill_num_warps(bt * 16, 128), num_stages=prefill_num_stages(bt * 16, 128))
    qwen = dict(HKV=4, D=256, BD=256, G=4, GP=4, BT=16, BLOCK=64, DOT_PRECISION="tf32", BM=64)
    compile_kernel("prefill attention, Qwen3.5 (tile 16)", prefill.prefill_fwd_kernel_attn, qwen, types,
                   num_warps=prefill_num_warps(64, 256), num_stages=2)
    # the launcher's two builds: short runs (sparse decode, 3 blocks a program at B = 4) preload their table entries
    # and pipeline 3 stages; long runs (dense decode over every block) and d > 128 load them in the loop at 2
    short, long = dict(PRELOAD=True, EPSP=4), dict(PRELOAD=False, EPSP=1)
    consts = {**geo, "G": 16, "GP": 16, "BLOCK": 64, "FINAL": False, "DOT_PRECISION": "tf32"}
    compile_kernel("decode attention split (short runs)", decode.decode_fwd_kernel_split, {**consts, **short}, types,
                   num_stages=3)
    compile_kernel("decode attention split (long runs)", decode.decode_fwd_kernel_split, {**consts, **long}, types,
                   num_stages=2)
    qwen_dec = dict(HKV=4, D=256, BD=256, G=4, GP=16, BLOCK=64, FINAL=False, DOT_PRECISION="tf32", **long)
    compile_kernel("decode attention split, Qwen3.5", decode.decode_fwd_kernel_split, qwen_dec, types, num_stages=2)
    compile_kernel("decode attention merge (96 runs)", decode.decode_fwd_kernel_merge,
                   {**geo, "G": 16, "GP": 16, "NSP": 128}, types, num_warps=8)
    return 0


# fmt: on


if __name__ == "__main__":
    sys.exit(main())
