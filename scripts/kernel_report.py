"""Compile longsparse's Triton kernels for sm_90 on a machine without a GPU and report their resources.

Catches compile-time type errors and shows registers, spills and shared memory per kernel and configuration, so a
kernel can be iterated on before it costs GPU time. Needs only the `triton` wheel (it ships ptxas).

    python scripts/kernel_report.py            # every registered kernel at the model geometry
    python scripts/kernel_report.py --ptx recur    # also dump the PTX of kernels whose name contains "recur"
    python scripts/kernel_report.py --only output --json   # one JSON line per build of the matching kernels
    python scripts/kernel_report.py --only fused --sweep   # BV × warps × stages: where a kernel fits its registers
    python scripts/kernel_report.py --only intra --mix     # also the SASS instruction mix (static counts by class)

Each kernel is compiled at the pipeline depth its launcher uses (Triton's default of 3 unless the launcher sets one).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DEFAULT_STAGES = 3  # Triton's default for CUDA: what a launch without num_stages gets
DEFAULT_DYNAMIC_SHARED = 48 * 1024
"""The dynamic shared memory a CUDA kernel may use without opting in; builds of exactly this size faulted on the
H200 (docs/gdn-kernels.md), so the report flags them."""


def compile_report(
    kernel,
    pointer_types: dict,
    constexprs: dict,
    scalars: dict | None = None,
    *,
    num_warps=4,
    num_stages=DEFAULT_STAGES,
    maxnreg=None,
) -> dict:
    """Compile ``kernel`` with the given pointer element types (e.g. ``{"k": "*bf16"}``, every pointer taken as
    16-byte aligned), scalar types and constexprs; return registers, spills, shared memory and the compiled object."""
    params = inspect.signature(kernel.fn).parameters
    names = list(params)
    # constexprs the caller leaves out take the kernel's defaults, as a launch that does not pass them does
    constexprs = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty} | constexprs
    scalars = scalars or {}
    signature = {}
    for n in names:
        if n in constexprs:
            signature[n] = "constexpr"
        elif n in scalars:
            signature[n] = scalars[n]
        elif n in pointer_types:
            signature[n] = pointer_types[n]
        else:
            raise KeyError(f"no type given for argument {n!r} of {kernel.fn.__name__}")
    # Pointers 16-byte aligned, as a launch with torch tensors specializes them: without it the compiler cannot
    # use vectorised or asynchronous (cp.async) loads, and the build would not be the one that runs.
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if str(signature[n]).startswith("*")}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:  # a register cap the launcher sets (e.g. SparseGDNKernelConfig.intra_registers)
        options["maxnreg"] = maxnreg
    compiled = triton.compile(src, target=TARGET, options=options)
    regs, spill_bytes = _ptxas_resources(compiled.asm["ptx"], compiled.metadata.name)
    return {"regs": regs, "spill_bytes": spill_bytes, "shared": compiled.metadata.shared, "compiled": compiled}


def _ptxas_resources(ptx: str, name: str) -> tuple[int | None, int | None]:
    """Registers and spill stores (bytes) reported by the ptxas that ships with triton."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True
        ).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return (int(regs.group(1)) if regs else None, int(spills.group(1)) if spills else None)


SASS_CLASSES = {
    "mma": ("HMMA", "HGMMA"),
    "shared_ops": ("LDS", "STS", "LDSM", "STSM", "ATOMS"),
    "shuffle": ("SHFL",),
    "select": ("SEL", "FSEL"),
    "convert": ("F2F", "F2FP", "I2F", "F2I", "PRMT"),
    "global": ("LDG", "STG"),
    "barrier": ("BAR",),
}
"""Opcode classes :func:`sass_mix` counts: the tensor-core products beside what feeds them (a tf32 operand from an
accumulator takes warp shuffles and selects; a 16-bit one conversions and byte permutes)."""


def sass_mix(compiled) -> dict:
    """Static SASS instruction counts of a build (``nvdisasm`` of its cubin): the total and :data:`SASS_CLASSES`.
    Loops count once, so compare builds of one kernel, not kernels."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    opcodes = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass, flags=re.M)
    mix = {"instructions": len(opcodes)}
    for name, ops in SASS_CLASSES.items():
        mix[name] = sum(op in ops for op in opcodes)
    return mix


def _kernel_cases():
    """``(name, kernel, pointer types, constexprs, scalar types, warps to try, launch options)`` per kernel; the
    options are the launcher's ``num_stages`` and, where it caps them, ``maxnreg``."""
    from longsparse.ops.gdn import SparseGDNConfig, SparseGDNKernelConfig, launch, walk_gluon
    from longsparse.ops.gdn.kernels import fused, intra, output, recur

    i32 = "*i32"
    geo = dict(H=16, HV=32, K=128, V=128)
    intra_ptrs = dict(k="*bf16", v="*bf16", g="*fp32", beta="*fp32", ct="*bf16", gamma="*fp32", score="*fp32")
    intra_ptrs.update(chunk_bos=i32, chunk_len=i32)
    blocks_ptrs = dict(intra_ptrs, q="*bf16", scores="*bf16")
    gluon_tiles = {"SCORE_ROWS": 128, "STORE_DENSE": True, "STORE_KEPT": False, "FAST_EXP": True, "SUB_SPLIT": True}
    for name, kernel, ptrs, extra, cap in (  # the op's kernel (16-bit inputs), with and without the stored scores
        (
            "intra",
            intra.sparse_gdn_fwd_kernel_intra_blocks,
            blocks_ptrs,
            {"STORE_SCORES": False, "FAST_EXP": True, "SUB_SPLIT": True, "F16_SOLVE": True},
            SparseGDNKernelConfig.intra_registers,
        ),  # fmt: skip
        (
            "intra-scores",
            intra.sparse_gdn_fwd_kernel_intra_blocks,
            blocks_ptrs,
            {"STORE_SCORES": True, "FAST_EXP": True, "SUB_SPLIT": True, "F16_SOLVE": True},
            SparseGDNKernelConfig.intra_registers,
        ),  # fmt: skip
        *(  # the Gluon walk's path: 128-row tiles taking the scores (where the walk reads them stored) and the dense
            # Ct, no kept blocks — the stored-scores build on tf32 products throughout (intra_forward(f16_solve=False))
            # and on the fp16 chain; the op's default build (the walk forms its
            # scores: the tiles take Ct alone) with intra's per-chunk fp16 range test and without it (the op's
            # bounded_inputs, as the model calls it)
            (
                name,
                intra.sparse_gdn_fwd_kernel_intra_blocks,
                blocks_ptrs,
                {**gluon_tiles, **consts},
                SparseGDNKernelConfig.intra_registers,
            )
            for name, consts in (
                ("intra-gluon-tiles-tf32", {"STORE_SCORES": True}),
                ("intra-gluon-tiles", {"STORE_SCORES": True, "F16_SOLVE": True}),
                ("intra-gluon-ct", {"F16_SOLVE": True}),
                ("intra-gluon-ct-bounded", {"F16_SOLVE": True, "F16_UNCHECKED": True}),
            )
        ),  # fmt: skip
        ("intra-tiles", intra.sparse_gdn_fwd_kernel_intra, intra_ptrs, {}, None),
    ):
        yield (
            name,
            kernel,
            ptrs,
            # the op's tf32 solve: the refinement step, and the split sub-diagonal product on the kept blocks
            dict(geo, IEEE=False, TF32X3=False, REFINE=True, **extra),
            {},
            [4, 8],
            dict(num_stages=DEFAULT_STAGES, maxnreg=cap),
        )
    state_args = dict(seg_seq=i32, seg_c0=i32, seq_chunk0=i32, chunk_bos=i32, chunk_len=i32)
    common = dict(k="*bf16", v="*bf16", g="*fp32", ct="*bf16", mask="*u8", h0="*fp32", entry="*fp32")
    tiling = dict(geo, P=16, CMAX=2048, BV=launch.TRITON_BLOCK_V, IEEE=False)  # the Triton walk's default tile
    entry = dict(tiling, HAS_H0=True, SEARCH_STEPS=12, KS_CORRECTION=SparseGDNKernelConfig.walk_correction == "ks")
    for name, extra in (("entry", {}), ("entry-gluon-tiles", dict(BV=walk_gluon.BLOCK_V, CT_TILES=True))):
        # the Gluon path's entry kernel runs at the Gluon walk's tile and reads Ct from its tiles
        yield (
            name,
            fused.sparse_gdn_fwd_kernel_entry,
            dict(common, prefix="*fp64", **state_args),
            dict(entry, **extra),
            {"tau": "fp32"},
            [4, 8],
            dict(num_stages=DEFAULT_STAGES),
        )
    for name, stored in (("fused", False), ("fused-stored-scores", True)):
        yield (
            name,
            fused.sparse_gdn_fwd_kernel_fused,
            dict(common, q="*bf16", o="*bf16", scores="*bf16", ht="*fp32", seg_c1=i32, seq_nchunks=i32, **state_args),
            dict(
                tiling,
                HAS_H0=True,
                HAS_ENTRY=True,
                STORE_FINAL=True,
                GROUPED=True,
                KS_CORRECTION=SparseGDNKernelConfig.walk_correction == "ks",
                HAS_SCORES=stored,
            ),
            {"scale": "fp32"},
            [4, 8],
            dict(num_stages=DEFAULT_STAGES),
        )
    yield (
        "scores",
        fused.sparse_gdn_fwd_kernel_scores,
        dict(q="*bf16", k="*bf16", g="*fp32", scores="*bf16", chunk_bos=i32, chunk_len=i32),
        dict(H=16, HV=32, K=128, IEEE=False),
        {},
        [4, 8],
        dict(num_stages=DEFAULT_STAGES),
    )
    csr_args = dict(event_index=i32, event_chunk=i32, u_new="*bf16", states="*bf16")
    for BV in (32, 64):
        yield (
            f"recur-bv{BV}",
            recur.sparse_gdn_fwd_kernel_recur,
            dict(
                common,
                **csr_args,
                prefix="*fp64",
                decay_total="*fp64",
                ht="*fp32",
                seg_c1=i32,
                seq_nchunks=i32,
                **state_args,
            ),
            dict(tiling, BV=BV, HAS_H0=True, HAS_ENTRY=True),
            {},
            [4, 8],
            dict(num_stages=DEFAULT_STAGES),
        )
    from longsparse.ops.gdn import select
    from longsparse.ops.gdn.kernels import select as select_kernels

    ratios = SparseGDNConfig.tier_ratios
    rows = select._table_host(16, ratios)
    decisions = dict(P=16, PP=16, NH=len(rows), NM=len(rows[0]) - 1, CMAX=select.SHORT_CHUNKS, MODE=0, FIXED_HIGH=0,
                     FIXED_MID=0, DETAILS=False)  # fmt: skip
    yield (  # the one-launch selector at its longest sequences (8K tokens), gate and decay prefix on
        "select-short",
        select_kernels.sparse_gdn_select_kernel_short,
        dict(
            score="*fp32",
            gamma="*fp32",
            gate="*bf16",
            gate_w="*fp32",
            seq_chunk0=i32,
            seq_nchunks=i32,
            chunk_bos=i32,
            chunk_len=i32,
            tier_k=i32,
            table=i32,
            prefix="*fp64",
            mask="*u8",
            tier="*i64",
            n_high_out="*i64",
            n_mid_out="*i64",
            x_out="*fp32",
            life_out="*fp32",
        ),  # fmt: skip
        dict(
            decisions,
            HV=32,
            HVP=32,
            V=128,
            GS=2,
            WINDOW=16,
            HAS_GATE=True,
            HAS_PREFIX=True,
            CP=select.SHORT_CHUNKS,
            BC=32,
        ),  # fmt: skip
        {"seed": "i32"},
        [4],
        dict(num_stages=DEFAULT_STAGES),
    )
    from longsparse.ops.conv import short_conv
    from longsparse.ops.conv.kernels import conv

    for has_state in (False, True):
        yield (
            f"conv-{'state' if has_state else 'zeros'}",
            conv.conv_fwd_kernel,
            dict(x_ptr="*bf16", w_ptr="*bf16", s_ptr="*bf16", y_ptr="*bf16", tok_start_ptr=i32, tok_seq_ptr=i32),
            dict(W=4, BT=short_conv.BLOCK_TOKENS, BC=short_conv.BLOCK_CHANNELS, HAS_STATE=has_state, SILU=True),
            {n: "i32" for n in ("T", "C", "stride_xt", "stride_yt", "stride_sn", "stride_sc")},
            [4],
            dict(num_stages=DEFAULT_STAGES),
        )
    from longsparse.ops.norm import rms
    from longsparse.ops.norm.kernels import rms as rms_kernels

    norms = (("gated-norm", 128, True, False, False), ("hidden-norm", 2560, False, True, False),
             ("qk-l2-norm", 128, False, False, True))  # fmt: skip
    for label, width, gated, zero_centered, l2 in norms:
        yield (
            label,
            rms_kernels.rms_norm_fwd_kernel,
            dict(x_ptr="*bf16", z_ptr="*bf16", w_ptr="*bf16", o_ptr="*bf16"),
            dict(
                D=width,
                BD=rms.next_pow2(width),
                BR=rms.rows_per_program(width),
                GATED=gated,
                ZERO_CENTERED=zero_centered,
                L2=l2,
            ),  # fmt: skip
            dict(R="i32", stride_x="i32", stride_z="i32", stride_o="i32", eps="fp32"),
            [4 if rms.next_pow2(width) <= rms.TILE_ELEMENTS else 8],
            dict(num_stages=DEFAULT_STAGES),
        )
    for BV in (32, 64):
        for grouped in (True, False):
            yield (
                f"output-bv{BV}-{'grouped' if grouped else 'per_chunk'}",
                output.sparse_gdn_fwd_kernel_output,
                dict(
                    {n: common[n] for n in ("k", "v", "g", "ct", "mask", "h0")},
                    **csr_args,
                    q="*bf16",
                    o="*bf16",
                    prefix="*fp64",
                    gamma="*fp32",
                    grp_seq=i32,
                    grp_pos=i32,
                    seq_chunk0=i32,
                    seq_nchunks=i32,
                    chunk_bos=i32,
                    chunk_len=i32,
                ),
                dict(tiling, BV=BV, HAS_H0=True, GROUPED=grouped),
                {"scale": "fp32"},
                [4, 8],
                dict(num_stages=launch.OUTPUT_NUM_STAGES),
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptx", default=None, help="dump the PTX of kernels whose name contains this")
    parser.add_argument("--only", default="", help="compile only the kernels whose name contains this")
    parser.add_argument("--json", action="store_true", help="one JSON object per build instead of a table")
    parser.add_argument("--mix", action="store_true", help="also the SASS instruction mix of each build (sass_mix)")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="instead of the launchers' settings, every BV of 16/32/64 (for kernels tiled by BV) × 2/4/8 warps × 1-3 "
        "stages: where a kernel could fit its registers",
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    ok = True
    for name, kernel, ptrs, const, scalars, warps, options in _kernel_cases():
        if args.only not in name:
            continue
        builds = [(const, w, options["num_stages"]) for w in warps]
        if args.sweep:
            tiles = [dict(const, BV=bv) for bv in (16, 32, 64)] if "BV" in const else [const]
            builds = [(c, w, st) for c in tiles for w in (2, 4, 8) for st in (1, 2, 3)]
        for const_b, w, stages_b in builds:
            label = name if not args.sweep or "BV" not in const_b else f"{name} BV={const_b['BV']}"
            try:
                r = compile_report(
                    kernel, ptrs, const_b, scalars, num_warps=w, num_stages=stages_b, maxnreg=options.get("maxnreg")
                )
            except Exception as exc:  # report every kernel, then fail
                ok = False
                print(f"{label:<24} warps={w}: COMPILE ERROR\n{str(exc)[-2000:]}")
                continue
            row = dict(kernel=label, warps=w, stages=stages_b, regs=r["regs"], spill_bytes=r["spill_bytes"],
                       shared=r["shared"])  # fmt: skip
            flag = "  <- exactly the 48 KiB default limit" if r["shared"] == DEFAULT_DYNAMIC_SHARED else ""
            if args.mix:
                row.update(sass_mix(r["compiled"]))
                flag += "  " + " ".join(f"{k}={v}" for k, v in row.items() if k in ("instructions", *SASS_CLASSES))
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{label:<24} warps={w} stages={stages_b}: regs={r['regs']} spill_bytes={r['spill_bytes']} "
                      f"shared={r['shared']} B{flag}", flush=True)  # fmt: skip
            if args.ptx and args.ptx in name:
                print(r["compiled"].asm["ptx"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
