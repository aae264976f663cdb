"""Ran on the H200 on 2026-12-02, 21:25 UTC (commit 05e4719;
``walk_ledger_tma.json`` beside it): ``../2026-12-02e/walk_ledger.py``'s ablations again, on the walk whose output role stores by
TMA (the default since 2026-12-02, 17:26 UTC; the patterns below name that kernel's text). Same method: each variant
is the kernel module with products, loads or the output's stores cut out and the barrier protocol kept, so only its
time is read; whole op at the Qwen3.5-4B GDN geometry, B = 1, T = 128K and 32K, the walk's device time by
torch.profiler. Adds ``out_no_decay`` (the scores' exp and mask cut: what forming the scores costs beyond ``Q Kᵀ``)
and ``plain_stores`` (the stores as before the change).

    timeout 300 python3 benchmarks/tuning/2026-12-02f/walk_ledger_tma.py  # on the H200: $OUT/walk_ledger_tma.json
    PYTHONPATH=<triton 3.6>:src python -P benchmarks/tuning/2026-12-02f/walk_ledger_tma.py --build
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02e"))
from walk_ledger import OUT_QK, OUT_QS, STATE_KS, STATE_WRITE, build_all, measure  # noqa: E402

OUT_AU = (
    "out = warpgroup_mma(a_tile, u_tile, eG * qs, is_async=True)\n            out = warpgroup_mma_wait(0, deps=(out,))",
    "out = eG * qs",
)
OUT_DECAY = ("_inline_scores(qk, G, n_rows, MMA)", "qk")
STATE_CTW = (
    "u = warpgroup_mma(ct, w_s, zero, use_acc=False, is_async=True)\n        u = warpgroup_mma_wait(0, deps=(u,))",
    "u = w",
)
_STORE = "_store_output(o, o_desc, o_s, scale * out, bos, n_rows, i_hv * V + t * BV, HV, V, MMA, INLINE_SCORES)"
NO_OUTPUT_STORE = (_STORE, "pass")
PLAIN_STORES = (_STORE, _STORE.replace("INLINE_SCORES)", "False)"))
_NBYTES = (
    "        q_desc.block_type.nbytes + k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes"
    " + a_desc.block_type.nbytes"
)
_CT_COPY = (
    "        tma.async_copy_global_to_shared(a_desc, [(cg * HV + i_hv) * TILE + (TILE - rows), 0], bar, a_t.index(s))"
)
NO_CT = [
    (_NBYTES, "        q_desc.block_type.nbytes + k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes"),
    (_CT_COPY, "        pass"),
]
OUTPUT = [OUT_QK, OUT_QS, OUT_AU]
STATE = [STATE_KS, STATE_CTW, *STATE_WRITE]
VARIANTS = {
    "base": [],
    "plain_stores": [PLAIN_STORES],
    "out_no_qk": [OUT_QK],
    "out_no_decay": [OUT_DECAY],
    "out_no_qs": [OUT_QS],
    "out_no_au": [OUT_AU],
    "out_none": OUTPUT,
    "state_no_ks": [STATE_KS],
    "state_no_ctw": [STATE_CTW],
    "state_no_write": STATE_WRITE,
    "state_none": STATE,
    "none": OUTPUT + STATE,
    "none_no_ostore": [*OUTPUT, *STATE, NO_OUTPUT_STORE],
    "none_no_ct": [*OUTPUT, *STATE, *NO_CT],
}
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the variants for sm_90a and report them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        build_all(folder, VARIANTS) if args.build else measure(folder, VARIANTS, "tma")
