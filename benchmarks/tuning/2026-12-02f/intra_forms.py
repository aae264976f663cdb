"""Ran on the H200 on 2026-12-02, 21:25 UTC (commit 05e4719;
``intra_forms.json`` beside it): intra's forms side by side, as the op runs it on the default Gluon path (the tiles' dense
``Ct`` rows alone, no kept blocks, no scores, 128 registers, fp16 chain, sub-diagonal split, refinement step).

Each form is ``intra.py`` with text replaced (as ``../2026-12-02e/walk_ledger.py`` does for the walk):

* ``dense_store``: the dense ``Ct`` tile assembled as ``[64, 64]`` and written by one store of whole rows (128 B),
  instead of four ``[4, 16, 16]`` stores of 32-byte row pieces (nine of the sixteen blocks being zeros);
* ``per_head``: one program per (chunk, value head) rather than per (chunk, head pair): half the chain per program,
  twice the programs, the Gram blocks formed per value head;
* both together.

Times each at 32K and 128K (B = 1, Qwen3.5-4B geometry) by ``bench.timing.benchmark`` and checks that tiles'
``Ct`` rows, ``gamma`` and ``score`` equal the base form's bit for bit.

    timeout 200 python3 benchmarks/tuning/2026-12-02f/intra_forms.py  # on the H200: $OUT/intra_forms.json
    PYTHONPATH=<triton 3.6>:src python -P benchmarks/tuning/2026-12-02f/intra_forms.py --build
"""

import argparse
import json
import os
import sys
import tempfile

from longsparse.ops.gdn import intra

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-02e"))
from walk_ledger import variant_module  # noqa: E402

SOURCE = intra.__file__
OUT = os.environ.get("OUT", ".")

DENSE_STORE = (
    """    row = (tiles + (i_c.to(tl.int64) * HV + i_hv) * (128 * 64) + 64 * 64) + (16 * blk + r) * 64 + c
    tl.store(row + 16 * blk, Ct_diag.to(dt))
    tl.store(row + 16 * ((blk + 3) % 4), tl.where(blk >= 1, Ct_sub, 0.0).to(dt))  # block (0, 3) is zero
    zero = tl.zeros([4, 16, 16], dtype=dt)
    tl.store(row + 16 * ((blk + 1) % 4), zero)
    tl.store(row + 16 * ((blk + 2) % 4), zero)""",
    """    b4 = tl.arange(0, 4)[:, None, None, None]
    cb = tl.arange(0, 4)[None, None, :, None]
    diag = tl.expand_dims(Ct_diag.to(dt), 2)
    sub = tl.expand_dims(Ct_sub.to(dt), 2)
    dense = tl.where(cb == b4, diag, tl.where(cb == b4 - 1, sub, tl.zeros_like(diag)))
    dense = tl.reshape(dense, [64, 64])
    o64 = tl.arange(0, 64)
    tile = tiles + (i_c.to(tl.int64) * HV + i_hv) * (128 * 64) + 64 * 64
    tl.store(tile + o64[:, None] * 64 + o64[None, :], dense)""",
)
PER_HEAD = [
    (
        """    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    GS: tl.constexpr = HV // H
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    kb = _load_blocks(""",
        """    i_c = tl.program_id(0)
    i_hv0 = tl.program_id(1)
    GS: tl.constexpr = HV // H
    i_h = i_hv0 // GS
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    kb = _load_blocks(""",
    ),
    (
        """    for jj in tl.static_range(GS):
        i_hv = i_h * GS + jj
        G, b = _load_gates(g, beta, bos, n, 0, HV, i_hv)""",
        """    for jj in tl.static_range(1):
        i_hv = i_hv0
        G, b = _load_gates(g, beta, bos, n, 0, HV, i_hv)""",
    ),
]
FORMS = {"base": [], "dense_store": [DENSE_STORE], "per_head": PER_HEAD, "both": [DENSE_STORE, *PER_HEAD]}
PTRS = dict(k="*bf16", v="*bf16", g="*fp32", beta="*fp32", ct="*bf16", gamma="*fp32", score="*fp32",
            chunk_bos="*i32", chunk_len="*i32", q="*bf16", scores="*bf16")  # fmt: skip
CONSTANTS = dict(H=16, HV=32, K=128, V=128, IEEE=False, TF32X3=False, STORE_SCORES=False, SCORE_ROWS=128,
                 STORE_DENSE=True, STORE_KEPT=False, FAST_EXP=True, REFINE=True, SUB_SPLIT=True, F16_SOLVE=True)  # fmt: skip


ABSOLUTE_IMPORTS = [  # the copy lives outside the package
    ("from ..._optional import require", "from longsparse._optional import require"),
    ("from .spec.intra import", "from longsparse.ops.gdn.spec.intra import"),
]


def form_module(name: str, folder: str):
    """``intra.py`` with ``FORMS[name]``'s replacements (``walk_ledger.variant_module``), written to ``folder``."""
    return variant_module(name, folder, FORMS[name] + ABSOLUTE_IMPORTS, source=SOURCE, prefix="intra_form")


def build_all(folder: str) -> None:
    """Compile every form for sm_90a (4 warps, 128 registers) and print registers, spills and shared memory."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
    import kernel_report as kr

    for name in FORMS:
        module = form_module(name, folder)
        r = kr.compile_report(module.sparse_gdn_fwd_kernel_intra_blocks, PTRS, CONSTANTS, num_warps=4, maxnreg=128)
        print(f"{name:12s} {r['regs']} registers, {r['spill_bytes']} B spilled, {r['shared']} B shared")


def measure(folder: str) -> None:
    import torch

    from longsparse.bench.gdn import HV, D, H, make_inputs
    from longsparse.bench.timing import benchmark
    from longsparse.ops.gdn import SparseGDNConfig, launch

    modules = {name: form_module(name, folder) for name in FORMS}
    cap = SparseGDNConfig().intra_registers
    rows = []
    for T in (32768, 131072):
        q, k, v, g, beta, *_ = make_inputs(1, T, shift=4.0)
        kf, vf = k.reshape(T, H, D), v.reshape(T, HV, D)
        gf, bf = g.reshape(T, HV).contiguous(), beta.reshape(T, HV).contiguous()
        plan = launch.plan_launch(1, T, None, q.device)
        NC = plan.layout.NC
        row, outs = {"T": T, "chunks": NC}, {}
        for name, module in modules.items():
            tiles = torch.zeros(NC, HV, 128, 64, dtype=q.dtype, device=q.device)
            gamma = torch.empty(NC, HV, dtype=torch.float32, device=q.device)
            score = torch.empty_like(gamma)
            grid = (NC, HV) if "head" in name or name == "both" else (NC, H)

            def call(m=module, tiles=tiles, gamma=gamma, score=score, grid=grid):
                m.sparse_gdn_fwd_kernel_intra_blocks[grid](
                    kf, vf, gf, bf, tiles, gamma, score, plan.chunk_bos, plan.chunk_len, kf, tiles,
                    **CONSTANTS, num_warps=4, maxnreg=cap,
                )  # fmt: skip

            call()
            torch.cuda.synchronize()
            outs[name] = (tiles[:, :, 64:].clone(), gamma.clone(), score.clone())
            row[f"{name}_ms"] = benchmark(call).median_ms
        base = outs["base"]
        for name, out in outs.items():
            row[f"{name}_bit_equal"] = all(torch.equal(a, b) for a, b in zip(out, base))
        print(row, flush=True)
        rows.append(row)
    with open(os.path.join(OUT, "intra_forms.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the forms for sm_90a and report them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        build_all(folder) if args.build else measure(folder)
