#!/usr/bin/env bash
# Issue 9 on a CUDA GPU (the H200): the GPU tests of the offloaded KV cache, the copy kernel, the decode pipeline and
# the block-sparse attention backends it runs,
# then `longsparse bench decode`. Results land in $OUT (the device tool's return folder) or ./benchmarks:
# results/decode.json, plots/decode.png, plus the two logs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DEST="${OUT:-benchmarks}"
mkdir -p "$DEST"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
set +e
python3 -m pytest tests/ops/transfer tests/cache tests/engine tests/models/test_sparse_attention.py -m gpu -q -p no:cacheprovider 2>&1 \
  | tee "$DEST/gpu_tests_offload.log"
tests_rc=${PIPESTATUS[0]}
set -e
python3 -m longsparse.cli bench --out "$DEST" decode 2>&1 | tee "$DEST/bench_decode.log"
echo "gpu tests exit code: $tests_rc"
exit "$tests_rc"
