#!/usr/bin/env bash
# `longsparse bench model` on the H200 in pieces of at most ~10 minutes, each merged (--append) into
# benchmarks/results/model.json; results and plots (one archive) and logs are copied to $OUT after every piece.
# Usage: scripts/h200_model.sh PIECE [PIECE ...]   (pieces below, in the order to run them when time is short;
# estimates in docs/benchmark-model.md). Each piece builds its model afresh (~1 min with imports); Triton's cache
# in ~/.triton spares later pieces on the same warm machine most of the compilation.
set -uo pipefail
OUT=${OUT:-.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:/tmp/peers${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
if [ -f .peers/peers-py312.tar.xz ] && [ ! -d /tmp/peers/fla ]; then
  python3 -m longsparse.bench.peers install .peers/peers-py312.tar.xz /tmp/peers >/dev/null
fi
LIMIT=${LIMIT:-570}   # seconds per piece: under the 10-minute command limit, so the copy to $OUT still happens
# The float32 check (bench model's default in bf16) runs in one piece per geometry (the 128K ones); the others pass
# --fp32-check-len 0 to save device time.

bench() {  # bench NAME ARGS...: one piece, time-boxed; finished rows are in the file whatever happens
  local name=$1
  shift
  timeout --signal=INT "$LIMIT" python3 -m longsparse.cli bench model --append "$@" 2>&1 \
    | grep -v "TileLang" | tee "$OUT/model_$name.log" | tail -40
}

for piece in "$@"; do
  case $piece in
    test)         # -x --tb=short: a failure's report is printed at once, before a time limit can cut it off
                  timeout "$LIMIT" python3 -m pytest -q -x --tb=short -p no:cacheprovider -m gpu \
                    tests/bench/test_model_suite.py 2>&1 | tee "$OUT/model_gpu_test.log" | tail -40 ;;
    4b-128k)      bench 4b-128k --geometry qwen3.5-4b --phase prefill --lengths 131072 --fp32-check-len 8192 ;;
    4b-main)      # the two headline cases in one process (one model build): 128K prefill, then 32K decode
                  bench 4b-main --geometry qwen3.5-4b --lengths 131072 --reps 2 --contexts 32768 --batches 1,4,16 \
                    --fp32-check-len 8192 ;;
    4b-decode32)  bench 4b-decode32 --geometry qwen3.5-4b --phase decode --contexts 32768 --fp32-check-len 0 ;;
    4b-short)     bench 4b-short --geometry qwen3.5-4b --phase prefill --lengths 8192,32768,65536 --fp32-check-len 0 ;;
    4b-decode128) bench 4b-decode128 --geometry qwen3.5-4b --phase decode --contexts 131072 --batches 1,4,16 --fp32-check-len 0 ;;
    4b-b64)       # batch 64 at 32K: 64 GiB of KV per model (transformers' and ours, one after the other)
                  bench 4b-b64 --geometry qwen3.5-4b --phase decode --contexts 32768 --batches 64 --fp32-check-len 0 ;;
    9b-short)     bench 9b-short --geometry qwen3.5-9b --phase prefill --lengths 8192,32768,65536 --fp32-check-len 0 ;;
    9b-128k)      bench 9b-128k --geometry qwen3.5-9b --phase prefill --lengths 131072 --fp32-check-len 8192 ;;
    9b-decode)    bench 9b-decode --geometry qwen3.5-9b --phase decode --batches 1,4,16 --fp32-check-len 0 ;;
    minicpm-short) bench minicpm-short --geometry minicpm4.1-8b --phase prefill --lengths 8192,32768,65536 --fp32-check-len 0 ;;
    minicpm-128k) bench minicpm-128k --geometry minicpm4.1-8b --phase prefill --lengths 131072 --reps 2 \
                    --fp32-check-len 8192 ;;
    minicpm-decode) bench minicpm-decode --geometry minicpm4.1-8b --phase decode --fp32-check-len 0 ;;
    *) echo "unknown piece: $piece" >&2; exit 2 ;;
  esac
done
# plots and tables from every row so far (a piece stopped by the time box did not draw them)
[ -f benchmarks/results/model.json ] && python3 -m longsparse.cli bench model --report 2>&1 | tail -60
# one archive beside the logs: the device tool brings back at most 8 files from $OUT
tar czf "$OUT/model_results.tgz" benchmarks/results/model.json benchmarks/plots/model_*.png 2>/dev/null || true
