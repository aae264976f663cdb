"""Ran on the H200 on 2026-12-03, 18:25 UTC (``transposed_state.json`` beside it): the output role's state
warpgroups holding the state transposed (``transposed_state.patch`` on the kernel module of commit 7754f91:
``Sᵀ`` as two key halves, so that every product on the state's chain takes its left operand from registers —
``(K S)ᵀ = Sᵀ K_cᵀ``, ``Uᵀ = Wᵀ Ctᵀ``, ``Rᵀ = e^γ Sᵀ + (U ⊙ e^{γ − G})ᵀ K_c`` — instead of ``S``, ``W`` and
``U ⊙ e^{γ − G}`` going through shared memory between them) against that module. Same bf16 operands, products
summed in another order: outputs compared by their largest difference.

    git show 7754f91:src/longsparse/ops/gdn/walk_gluon_kernel.py > base.py
    git apply benchmarks/tuning/2026-12-03c/transposed_state.patch   # on a tree at 7754f91
    timeout 300 python3 benchmarks/tuning/2026-12-03c/transposed_state.py --base base.py   # $OUT/transposed_state.json
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02e"))
from compare import compare  # noqa: E402
from walk_ledger import SOURCE, variant_module  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the kernel module of commit 7754f91")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        modules = {
            "base": variant_module("base", folder, [], source=args.base, prefix="walk_base"),
            "transposed": variant_module("transposed", folder, [], source=SOURCE, prefix="walk_tree"),
        }
        compare(modules, "transposed_state")
