"""Compile the Gluon walk (``longsparse.ops.gdn.walk_gluon``) for sm_90a on a machine without a GPU and report its
registers, spills and shared memory per value tile and output rule, at the Qwen3.5-4B GDN geometry.

Needs Triton 3.6 (the Gluon dialect the walk is written for; the wheel ships ptxas), not a GPU. With that wheel
installed into a folder of its own (``pip install --target SITE triton==3.6.0``):

    PYTHONPATH=SITE:src python -P scripts/gluon_walk_report.py [--ptx DIR]

The kernel's signature comes from the launcher's own TMA descriptors, built on small CPU tensors (their types carry
block shape and shared layout; the shapes and strides are runtime values), so the build is the one a launch makes.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_report import TARGET, _ptxas_resources  # noqa: E402

from longsparse.ops.gdn import walk_gluon  # noqa: E402

GEOMETRY = dict(P=16, CMAX=2048, H=16, HV=32, K=128, V=128)


def build(
    block_v: int,
    grouped: bool,
    dtype=torch.bfloat16,
    debug: bool = False,
    stages: int = 1,
    ws: bool = False,
    output_role: bool = False,
    inline: bool = False,
):
    """Compile the walk at value tile ``block_v`` (``debug``: the build that records intermediate products; ``ws``:
    the warp-specialised walk, one CTA per (segment, value head); ``output_role``: its form with the output's
    products in a warpgroup of their own; ``inline``: that form forming the scores itself); returns the compiled
    kernel."""
    from triton.experimental.gluon._runtime import GluonASTSource

    kern = walk_gluon.kernel_module()
    H, HV, K, V = (GEOMETRY[n] for n in ("H", "HV", "K", "V"))
    q = torch.zeros(64, H, K, dtype=dtype)
    v = torch.zeros(64, HV, V, dtype=dtype)
    tiles = torch.zeros(1, HV, walk_gluon.TILE_ROWS, 64, dtype=dtype)
    descs = walk_gluon.descriptors(q, q, v, tiles, block_v, inline, v if output_role else None)
    if ws:
        fn = kern.sparse_gdn_fwd_kernel_walk_gluon_ws3 if output_role else kern.sparse_gdn_fwd_kernel_walk_gluon_ws
    else:
        fn = kern.sparse_gdn_fwd_kernel_walk_gluon
    names = list(inspect.signature(fn.fn).parameters)
    constexprs = dict(
        GEOMETRY, BV=block_v, HAS_H0=True, HAS_ENTRY=True, GROUPED=grouped, DEBUG=debug,
        STAGES=stages, INLINE_SCORES=inline,
    )  # fmt: skip
    constexprs = {n: value for n, value in constexprs.items() if n in names}
    pointers = dict(
        ct="*bf16", g="*fp32", mask="*u8", h0="*fp32", entry="*fp32", o="*bf16", ht="*fp32", seg_seq="*i32",
        seg_c0="*i32", seg_c1="*i32", seq_chunk0="*i32", seq_nchunks="*i32", chunk_bos="*i32", chunk_len="*i32",
        dbg="*fp32" if debug else "*bf16",
    )  # fmt: skip
    given = dict(zip(("q_desc", "k_desc", "v_desc", "a_desc", "o_desc"), (mangle_type(d) for d in descs)))
    signature = {}
    for n in names:
        signature[n] = "constexpr" if n in constexprs else given.get(n) or pointers.get(n) or {"scale": "fp32"}[n]
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if signature[n].startswith("*")}
    src = GluonASTSource(fn, signature, constexprs=constexprs, attrs=aligned)
    return triton.compile(src, target=TARGET, options={"num_warps": kern.WARPS.value})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptx", help="also write each build's PTX into this folder")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, target {TARGET}")
    failed = 0
    builds = [  # (block_v, grouped, stages, debug, warp-specialised, output role, inline scores)
        (bv, grouped, stages, False, False, False, False)
        for bv in walk_gluon.BLOCK_VS[::-1]
        for stages in (2, 1)
        for grouped in (True, False)
    ]
    builds += [
        (64, grouped, 2, False, True, role, inline)
        for role, inline in ((False, False), (True, False), (True, True))
        for grouped in (True, False)
    ]
    for block_v, grouped, stages, debug, ws, role, inline in builds + [(64, True, 1, True, False, False, False)]:
        label = (
            f"BV={block_v:3d} stages={stages} grouped={grouped!s:5}"
            + (" ws" if ws else "")
            + (" output-role" if role else "")
            + (" inline" if inline else "")
            + (" debug" if debug else "")
        )
        try:
            compiled = build(block_v, grouped, debug=debug, stages=stages, ws=ws, output_role=role, inline=inline)
        except Exception as exc:  # report every build, then fail
            failed += 1
            print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:4000]}")
            continue
        regs, spills = _ptxas_resources(compiled.asm["ptx"], compiled.metadata.name)
        print(
            f"{label}: {regs} registers, {spills} B spilled, {compiled.metadata.shared} B shared memory, "
            f"{compiled.metadata.num_warps} warps"
        )
        if args.ptx:
            os.makedirs(args.ptx, exist_ok=True)
            name = (
                f"walk_gluon_bv{block_v}_s{stages}_g{int(grouped)}{'_ws' if ws else ''}{'_role' if role else ''}"
                f"{'_inline' if inline else ''}"
                f"{'_debug' if debug else ''}.ptx"
            )
            with open(os.path.join(args.ptx, name), "w") as f:
                f.write(compiled.asm["ptx"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
