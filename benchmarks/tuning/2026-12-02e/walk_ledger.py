"""Ran on the H200 on 2026-12-02 (16:50 and 17:07 UTC) against the kernel module of commit db70eb7 (its patterns
match that text, not later ones): where the Gluon walk's time goes (the default form: output role forming the scores), by
ablation. Each variant is the kernel module with some products replaced by what they would pass on unchanged (the
barrier protocol, the loads and the stores stay), so its outputs are wrong and only its time is read; ``qs_pair``
is a candidate, not an ablation (the output role issues both V tiles' ``Q S_read`` before either ``A U``; its output
must equal the default's). Whole op at the Qwen3.5-4B GDN geometry, B = 1, T = 128K and 32K; per variant the
walk's device time (torch.profiler) and the output's relative difference to the default. ``--set bytes``: the
product-free walk without each of its loads and without the output's stores (the producer expecting the rest).

    timeout 300 python3 benchmarks/tuning/2026-12-02e/walk_ledger.py --set products   # $OUT/walk_ledger_products.json
    PYTHONPATH=/work/venv36/lib/python3.11/site-packages:src python -P benchmarks/tuning/2026-12-02e/walk_ledger.py --build

``--build`` compiles every variant for sm_90a without a GPU (Triton 3.6) and prints registers and spills.
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from unittest import mock

import torch

from longsparse.ops.gdn import walk_gluon

SOURCE = os.path.join(os.path.dirname(walk_gluon.__file__), "walk_gluon_kernel.py")

# (old, new) pairs; each old text must occur exactly once in the kernel module.
OUT_QK = (
    "qk = warpgroup_mma(q_t.index(stage), k_t.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)\n"
    "            qk = warpgroup_mma_wait(0, deps=(qk,))",
    "qk = zero",
)
OUT_QS = (
    "qs = warpgroup_mma(q_t.index(stage), s_tile, zero, use_acc=False, is_async=True)\n"
    "            qs = warpgroup_mma_wait(0, deps=(qs,))",
    "qs = zero",
)
OUT_AU = (
    "out = warpgroup_mma(a_t.index(stage).slice(0, CHUNK), u_tile, eG * qs, is_async=True)\n"
    "            out = warpgroup_mma_wait(0, deps=(out,))",
    "out = eG * qs",
)
STATE_KS = ("        if selected:\n            ks = warpgroup_mma(k_c,", "        if False:\n            ks = warpgroup_mma(k_c,")
STATE_CTW = (
    "u = warpgroup_mma(a_t.index(stage).slice(CHUNK, CHUNK), w_s, zero, use_acc=False, is_async=True)\n"
    "        u = warpgroup_mma_wait(0, deps=(u,))",
    "u = w",
)
STATE_WRITE = [
    ("r_lo = _write_half(k_c, w_s, S_lo * decay, 0)", "r_lo = S_lo * decay"),
    ("r_hi = _write_half(k_c, w_s, S_hi * decay, 1)", "r_hi = S_hi * decay"),
]
_TILE_LOOP_OLD = """        for t in gl.static_range(2):
            if t == 0:
                s_tile = states0.index(read)
                u_tile = u0_s
            else:
                s_tile = states1.index(read)
                u_tile = u1_s
            mbarrier.wait(s_ready.index(t), i & 1)
            qs = warpgroup_mma(q_t.index(stage), s_tile, zero, use_acc=False, is_async=True)
            qs = warpgroup_mma_wait(0, deps=(qs,))
            gl.thread_barrier()
            mbarrier.arrive(s_read.index(t))
            mbarrier.wait(u_ready.index(t), i & 1)
"""
_TILE_LOOP_NEW = """        mbarrier.wait(s_ready.index(0), i & 1)
        qs0 = warpgroup_mma(q_t.index(stage), states0.index(read), zero, use_acc=False, is_async=True)
        mbarrier.wait(s_ready.index(1), i & 1)
        qs1 = warpgroup_mma(q_t.index(stage), states1.index(read), zero, use_acc=False, is_async=True)
        qs0 = warpgroup_mma_wait(1, deps=(qs0,))
        gl.thread_barrier()
        mbarrier.arrive(s_read.index(0))
        qs1 = warpgroup_mma_wait(0, deps=(qs1,))
        gl.thread_barrier()
        mbarrier.arrive(s_read.index(1))
        for t in gl.static_range(2):
            if t == 0:
                u_tile = u0_s
                qs = qs0
            else:
                u_tile = u1_s
                qs = qs1
            mbarrier.wait(u_ready.index(t), i & 1)
"""
QS_PAIR = (_TILE_LOOP_OLD, _TILE_LOOP_NEW)

_NBYTES = (
    "        q_desc.block_type.nbytes + k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes + a_desc.block_type.nbytes"
)
_COPIES = {
    "k": "        tma.async_copy_global_to_shared(k_desc, [bos, i_h * K], bar, k_t.index(s))",
    "v": "        tma.async_copy_global_to_shared(v_desc, [bos, i_hv * V], bar, v0_t.index(s))\n"
    "        tma.async_copy_global_to_shared(v_desc, [bos, i_hv * V + BV], bar, v1_t.index(s))",
    "q": "        tma.async_copy_global_to_shared(q_desc, [bos, i_h * K], bar, q_t.index(s))",
    "ct": "            tma.async_copy_global_to_shared(\n"
    "                a_desc, [(cg * HV + i_hv) * TILE + CHUNK, 0], bar, a_t.index(s).slice(CHUNK, CHUNK)\n"
    "            )",
}
_BYTES = {"k": "k_desc.block_type.nbytes", "v": "2 * v_desc.block_type.nbytes", "q": "q_desc.block_type.nbytes",
          "ct": "a_desc.block_type.nbytes"}  # fmt: skip


def producer_without(*names: str) -> list:
    """Replacements by which the producer loads none of ``names`` (of q, k, v, ct) and expects only the rest."""
    kept = " + ".join(b for n, b in _BYTES.items() if n not in names)
    indent = {n: " " * (len(c) - len(c.lstrip())) for n, c in _COPIES.items()}
    return [(_NBYTES, "        " + kept)] + [(_COPIES[n], indent[n] + "pass") for n in names]


NO_OUTPUT_STORE = (
    "            gl.store(p_o, (scale * out).to(o.dtype.element_ty), mask=(rows < n_rows)[:, None])\n"
    "        gl.thread_barrier()  # both tiles",
    "        gl.thread_barrier()  # both tiles",
)
NO_PRODUCTS = [OUT_QK, OUT_QS, OUT_AU, STATE_KS, STATE_CTW, *STATE_WRITE]

BYTES_VARIANTS = {
    "base": [],
    "base_no_ct": producer_without("ct"),
    "base_no_q": producer_without("q"),
    "none": NO_PRODUCTS,
    "none_no_ostore": [*NO_PRODUCTS, NO_OUTPUT_STORE],
    "none_no_ct": [*NO_PRODUCTS, *producer_without("ct")],
    "none_no_q": [*NO_PRODUCTS, *producer_without("q")],
    "none_no_v": [*NO_PRODUCTS, *producer_without("v")],
    "none_k_only": [*NO_PRODUCTS, NO_OUTPUT_STORE, *producer_without("q", "v", "ct")],
}
PRODUCT_VARIANTS = {
    "base": [],
    "qs_pair": [QS_PAIR],
    "out_no_qk": [OUT_QK],
    "out_no_qs": [OUT_QS],
    "out_no_au": [OUT_AU],
    "out_none": [OUT_QK, OUT_QS, OUT_AU],
    "state_no_ks": [STATE_KS],
    "state_no_ctw": [STATE_CTW],
    "state_no_write": STATE_WRITE,
    "state_none": [STATE_KS, STATE_CTW, *STATE_WRITE],
    "none": NO_PRODUCTS,
}
SETS = {"products": PRODUCT_VARIANTS, "bytes": BYTES_VARIANTS}
VARIANTS = {**PRODUCT_VARIANTS, **BYTES_VARIANTS}
CALLS = 10
OUT = os.environ.get("OUT", ".")


def variant_module(name: str, folder: str, replacements: list | None = None, source: str = SOURCE,
                   prefix: str = "walk_variant"):  # fmt: skip
    """The module at ``source`` (default: the walk's kernel module) with ``replacements`` (default
    ``VARIANTS[name]``) applied, written to ``folder`` as ``{prefix}_{name}.py`` (Triton reads a kernel's source)."""
    with open(source) as f:
        text = f.read()
    for old, new in VARIANTS[name] if replacements is None else replacements:
        if text.count(old) != 1:
            raise SystemExit(f"variant {name}: {old[:60]!r} occurs {text.count(old)} times in {source}")
        text = text.replace(old, new)
    path = os.path.join(folder, f"{prefix}_{name}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(f"{prefix}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_all(folder: str, variants: dict) -> None:
    """Compile every variant (name -> replacements) for sm_90a and print its registers, spills and shared memory."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
    from gluon_walk_report import _ptxas_resources, build

    for name, replacements in variants.items():
        module = variant_module(name, folder, replacements)
        with mock.patch.object(walk_gluon, "kernel_module", lambda m=module: m):
            compiled = build(64, True, stages=2, ws=True, output_role=True, inline=True)
        regs, spills = _ptxas_resources(compiled.asm["ptx"], compiled.metadata.name)
        print(f"{name:15s} {regs} registers, {spills} B spilled, {compiled.metadata.shared} B shared memory")


def measure(folder: str, variants: dict, label: str) -> None:
    """Time every variant (name -> replacements; one named ``base``) at 128K and 32K into
    ``$OUT/walk_ledger_{label}.json``."""
    from longsparse.bench.gdn import make_inputs
    from longsparse.bench.timing import benchmark_side_by_side, self_time_by_kernel_us
    from longsparse.ops.gdn import SparseGDNConfig, sparse_chunk_gated_delta_rule
    from longsparse.ops.gdn.launch import plan_launch

    modules = {name: variant_module(name, folder, r) for name, r in variants.items()}
    rows = []
    for T in (131072, 32768):
        q, k, v, g, beta, gate, w = make_inputs(1, T, 4.0)
        plan = plan_launch(1, T, None, q.device)
        config = SparseGDNConfig()

        def op(module):
            def call():
                with mock.patch.object(walk_gluon, "kernel_module", lambda: module):
                    return sparse_chunk_gated_delta_rule(
                        q, k, v, g, beta, output_final_state=True, gate=gate, gate_norm_weight=w, plan=plan,
                        config=config,
                    )

            return call

        o_ref, _ = op(modules["base"])()
        row = {"T": T}
        for name, module in modules.items():
            o, _ = op(module)()
            torch.cuda.synchronize()
            row[f"{name}_o_rel"] = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
            per_kernel = self_time_by_kernel_us(op(module), CALLS)
            row[f"{name}_walk_us"] = sum(t for n, t in per_kernel.items() if "walk_gluon" in n)
            print(json.dumps({"T": T, "variant": name, "walk_us": row[f"{name}_walk_us"]}), flush=True)
        if "qs_pair" in modules:
            times = benchmark_side_by_side({n: op(modules[n]) for n in ("base", "qs_pair")}, rounds=3)
            row.update({f"{n}_ms": t.median_ms for n, t in times.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(os.path.join(OUT, f"walk_ledger_{label}.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the variants for sm_90a and report them")
    parser.add_argument("--set", choices=SETS, default="products", help="which variants (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        build_all(folder, SETS[args.set]) if args.build else measure(folder, SETS[args.set], args.set)
