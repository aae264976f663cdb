"""Run on the H200 on 2026-12-04 (records in this folder's README): intra with
its fp16 solve taken for every (chunk, value head) outside any branch, and the tf32 solve only behind a test that
the fp16 result is finite (an fp16 operand past 65504 turns it inf or NaN), against intra as it is (the fp16 solve
where ``max β · max |k|² <= F16_SOLVE_BOUND``, else the tf32 one: a branch between two copies of the solve, 8 % of
intra by ``../2026-12-03c/intra_branch.py``) and against that probe (``f16_only``). Bit-equal to the base on the
bench's L2-normalised keys; ``../2026-12-03c/emulate_scaled_fp16.txt`` has the fp16 chain as accurate as the tf32
one on keys of norm up to 4 and β up to 2, its largest operand 819.

    timeout 200 python3 benchmarks/tuning/2026-12-04b/intra_finite_check.py   # on the H200: $OUT/intra_finite_check.json
    PYTHONPATH=<triton 3.6>:src python -P benchmarks/tuning/2026-12-04b/intra_finite_check.py --build
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02f"))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-03c"))
import intra_forms  # noqa: E402
from intra_branch import F16_ONLY  # noqa: E402

FINITE_CHECK = (
    """        if F16_SOLVE and (tl.max(tl.max(b, 1), 0) * key_norm2 <= F16_SOLVE_BOUND):
            Ct_diag, Ct_sub = _block_coefficients(gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye, prev_blocks,
                                                  IEEE, TF32X3, REFINE, SUB_SPLIT, FAST_EXP, True)  # fmt: skip
        else:  # (with F16_SOLVE: inputs outside fp16's range, e.g. keys not normalised)
            Ct_diag, Ct_sub = _block_coefficients(gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye, prev_blocks,
                                                  IEEE, TF32X3, REFINE, SUB_SPLIT, FAST_EXP, False)  # fmt: skip""",
    """        Ct_diag, Ct_sub = _block_coefficients(gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye,
                                              prev_blocks, IEEE, TF32X3, REFINE, SUB_SPLIT, FAST_EXP, F16_SOLVE)
        if F16_SOLVE:  # x * 0 is 0 for finite x, NaN for inf and NaN
            bad = ((Ct_diag * 0.0 != 0.0) | (Ct_sub * 0.0 != 0.0)).to(tl.int32)
            if tl.sum(tl.sum(tl.sum(bad, 2), 1), 0) > 0:
                Ct_diag, Ct_sub = _block_coefficients(gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye,
                                                      prev_blocks, IEEE, TF32X3, REFINE, SUB_SPLIT, FAST_EXP, False)""",
)
FORMS = {"base": [], "f16_only": [F16_ONLY], "finite_check": [FINITE_CHECK]}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the forms for sm_90a and report them")
    args = parser.parse_args()
    intra_forms.FORMS = FORMS
    intra_forms.ABSOLUTE_IMPORTS.append(("from .._launch import fast", "from longsparse.ops._launch import fast"))
    with tempfile.TemporaryDirectory() as folder:
        if args.build:
            intra_forms.build_all(folder)
        else:
            intra_forms.measure(folder)
            out = os.environ.get("OUT", ".")
            shutil.move(os.path.join(out, "intra_forms.json"), os.path.join(out, "intra_finite_check.json"))
            print(json.dumps(json.load(open(os.path.join(out, "intra_finite_check.json")))))
