#!/usr/bin/env bash
# Issue 5 on a CUDA GPU (the H200): the sparse-attention GPU tests, then `longsparse bench attn`.
# Results land in $OUT (the device tool's return folder) or ./benchmarks: results/sparse_attn.json,
# plots/sparse_attn.png, plots/sparse_attn_decode.png, plus the two logs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEST="${OUT:-benchmarks}"
mkdir -p "$DEST"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
set +e
python3 -m pytest tests/ops/sparse_attn -m gpu -q -p no:cacheprovider 2>&1 | tee "$DEST/gpu_tests_attn.log"
tests_rc=${PIPESTATUS[0]}
set -e
python3 -m longsparse.cli bench --out "$DEST" attn 2>&1 | tee "$DEST/bench_attn.log"
echo "gpu tests exit code: $tests_rc"
exit "$tests_rc"
