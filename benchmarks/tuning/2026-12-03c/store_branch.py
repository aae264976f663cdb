"""What the output role's per-chunk branch between its TMA store and its masked store costs: the walk as it is
against the walk with the branch folded to the TMA store (``tma_only``; every chunk of the bench's lengths is whole,
so the outputs must be equal bit for bit). A probe, not a candidate: ``tma_only`` would write a short last chunk's
box into the next sequence's rows.

    timeout 200 python3 benchmarks/tuning/2026-12-03c/store_branch.py   # on the H200: $OUT/store_branch.json
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02e"))
from compare import compare  # noqa: E402
from walk_ledger import variant_module  # noqa: E402

TMA_ONLY = ("        if n_rows == CHUNK:", "        if True:")

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        modules = {n: variant_module(n, folder, r) for n, r in (("base", []), ("tma_only", [TMA_ONLY]))}
        compare(modules, "store_branch", cases=[(1, 131072), (1, 32768)])
