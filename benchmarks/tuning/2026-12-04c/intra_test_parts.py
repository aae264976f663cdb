"""Which part of intra's fp16/tf32 test costs: intra as the op runs it on the Gluon path (``../2026-12-02f``'s
harness) against the same kernel with the test reduced to ``max β`` alone (``beta_only``: what a form would keep
if the op had normalised the keys itself), to ``max |k|²`` alone (``keys_only``: β known to be at most 1), or
folded away (``f16_only``, as in ``../2026-12-03c/intra_branch.py``). Probes: on the bench's unit keys and β < 1
every chunk passes every test, so all forms must equal the base bit for bit.

    timeout 200 python3 benchmarks/tuning/2026-12-04c/intra_test_parts.py   # on the H200: $OUT/intra_test_parts.json
"""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-02f"))
import intra_forms  # noqa: E402

TEST = "        if F16_SOLVE and (tl.max(tl.max(b, 1), 0) * key_norm2 <= F16_SOLVE_BOUND):"
FORMS = {
    "base": [],
    "f16_only": [(TEST, "        if F16_SOLVE:")],
    "beta_only": [(TEST, "        if F16_SOLVE and (tl.max(tl.max(b, 1), 0) <= F16_SOLVE_BOUND):")],
    "keys_only": [(TEST, "        if F16_SOLVE and (key_norm2 <= F16_SOLVE_BOUND):")],
}

if __name__ == "__main__":
    intra_forms.FORMS = FORMS
    intra_forms.ABSOLUTE_IMPORTS.append(("from .._launch import fast", "from longsparse.ops._launch import fast"))
    with tempfile.TemporaryDirectory() as folder:
        intra_forms.measure(folder)
    out = os.environ.get("OUT", ".")
    shutil.move(os.path.join(out, "intra_forms.json"), os.path.join(out, "intra_test_parts.json"))
    print(json.dumps(json.load(open(os.path.join(out, "intra_test_parts.json")))))
