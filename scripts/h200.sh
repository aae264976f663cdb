#!/usr/bin/env bash
# One batched GPU session on the H200: install the peer bundle, run the GPU tests, run the named benchmarks, and copy
# results, plots and logs to $OUT. Usage: scripts/h200.sh "TEST_SELECTION" "SUITE [SUITE ...]"
set -uo pipefail
OUT=${OUT:-.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:/tmp/peers${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
if [ -f .peers/peers-py312.tar.xz ] && [ ! -d /tmp/peers/fla ]; then
  python3 -m longsparse.bench.peers install .peers/peers-py312.tar.xz /tmp/peers >/dev/null
fi
python3 -m longsparse.cli info | tee "$OUT/info.txt"
if [ -n "${1:-}" ]; then
  python3 -m pytest -q -x -p no:cacheprovider $1 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
for suite in ${2:-}; do
  python3 -m longsparse.cli bench $suite 2>&1 | grep -v "TileLang" | tee "$OUT/bench_$suite.log" | tail -30
done
# one archive: the device tool brings back at most 8 files from $OUT
tar czf "$OUT/results.tgz" benchmarks/results benchmarks/plots 2>/dev/null || true
