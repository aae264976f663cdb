"""Ran on the H200 on 2026-12-03, 17:50 UTC (``split_release.json`` beside it): the Gluon walk with each part of a
ring stage released on its own (``split_release.patch``: the producer refills a stage's V tiles once both state
warpgroups have formed ``W``, its ``Ct`` after ``U = Ct W``, ``Q`` after the output's last ``Q S_read``, ``K`` after
the write, instead of the whole stage once every consumer has finished the chunk) against the walk of d06ebfd.

    git show d06ebfd:src/longsparse/ops/gdn/walk_gluon_kernel.py > base.py
    cp base.py split.py && patch split.py benchmarks/tuning/2026-12-03c/split_release.patch
    timeout 300 python3 benchmarks/tuning/2026-12-03c/split_release.py --base base.py --split split.py
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02e"))
from compare import compare  # noqa: E402
from walk_ledger import variant_module  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the kernel module of commit d06ebfd")
    parser.add_argument("--split", required=True, help="that module with split_release.patch applied")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        modules = {
            "whole": variant_module("whole", folder, [], source=args.base, prefix="walk_base"),
            "split": variant_module("split", folder, [], source=args.split, prefix="walk_split"),
        }
        compare(modules, "split_release")
