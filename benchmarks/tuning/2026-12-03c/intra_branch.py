"""What the intra kernel's per-(chunk, value head) branch between its fp16 and tf32 solves costs: intra as the op
runs it on the Gluon path (``../2026-12-02f/intra_forms.py``'s harness and constants) against the same kernel with
the fp16 solve taken unconditionally (``f16_only``: the branch folded at compile time; on the bench's L2-normalised
keys and β < 1 every chunk takes the fp16 solve anyway, so the outputs must be equal bit for bit). A probe, not a
candidate: ``f16_only`` drops the fallback that keeps fp16's range safe for other inputs.

    timeout 200 python3 benchmarks/tuning/2026-12-03c/intra_branch.py   # on the H200: $OUT/intra_branch.json
"""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-02f"))
import intra_forms  # noqa: E402

F16_ONLY = (
    "        if F16_SOLVE and (tl.max(tl.max(b, 1), 0) * key_norm2 <= F16_SOLVE_BOUND):",
    "        if F16_SOLVE:",
)

if __name__ == "__main__":
    intra_forms.FORMS = {"base": [], "f16_only": [F16_ONLY]}
    intra_forms.ABSOLUTE_IMPORTS.append(("from .._launch import fast", "from longsparse.ops._launch import fast"))
    with tempfile.TemporaryDirectory() as folder:
        intra_forms.measure(folder)
    out = os.environ.get("OUT", ".")
    shutil.move(os.path.join(out, "intra_forms.json"), os.path.join(out, "intra_branch.json"))
    print(json.dumps(json.load(open(os.path.join(out, "intra_branch.json")))))
