"""One SparseGDN op call at the Qwen3.5-4B GDN geometry inside a CUDA profiler range, for Nsight Compute: where the
intra, entry and walk kernels stall (warp states, pipe utilisation, occupancy) rather than only how long they take.
Needs a CUDA GPU and ``ncu`` (the H200 image has it in /usr/local/cuda/bin).

    ncu --profile-from-start off --kernel-name regex:"sparse_gdn_(fwd|select)_kernel_" \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \\
        --csv --page details python scripts/profile_gdn.py --tokens 131072 > $OUT/gdn_ncu.csv

Warm-up calls (compilation, the kept launch plan) run before the range; the range holds one call. The main pass, the
walk's form and the tile follow ``SparseGDNKernelConfig`` unless ``--main-pass`` / ``--walk-correction`` /
``--block-v`` say otherwise (``--main-pass csr`` profiles the recurrence and output kernels apart, which ``bench gdn``
times only as a sum).
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--main-pass", default=None)
    parser.add_argument("--walk-correction", default=None)
    parser.add_argument("--block-v", type=int, default=None)
    parser.add_argument(
        "--walk-form", choices=("ws", "single"), default=None,
        help="the Gluon walk's form at BV = 64: warp-specialised or one warpgroup per V tile "
        "(SparseGDNKernelConfig.walk_warp_specialised)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from longsparse.bench.gdn import make_inputs
    from longsparse.ops.gdn import SparseGDNKernelConfig, sparse_chunk_gated_delta_rule

    given = {"main_pass": args.main_pass, "walk_correction": args.walk_correction, "block_v": args.block_v}
    given["walk_warp_specialised"] = None if args.walk_form is None else args.walk_form == "ws"
    config = SparseGDNKernelConfig(**{name: value for name, value in given.items() if value is not None})
    q, k, v, g, beta, gate, weight = make_inputs(1, args.tokens, shift=4.0)

    def call():
        return sparse_chunk_gated_delta_rule(q, k, v, g, beta, gate=gate, gate_norm_weight=weight, kernel_config=config)

    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled one call at T = {args.tokens}: {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
