#!/usr/bin/env bash
# Every run prepared in this folder, for one device session: two calls of under 10 minutes each. Results in $OUT.
#
#   bash benchmarks/tuning/next/run_device.sh attn   # sparse-attention GPU tests (the top-k forms' among them),
#                                                    # then topk_forms.py (~2-3 min)
#   bash benchmarks/tuning/next/run_device.sh walk   # walk_coupling.py (~3-4 min)
#
# Before the call, here: move models/hybrid-tiny/model.safetensors out of the tree (the device takes 64 MiB; git
# checkout brings it back, and nothing may be committed while it is out). Set LONGSPARSE_GIT_COMMIT to the local
# HEAD so that the JSON names the commit (the device's copy of the tree carries stale git metadata).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEST="${OUT:-.}"
mkdir -p "$DEST"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
case "${1:-}" in
  attn)
    timeout 150 python3 -m pytest tests/ops/sparse_attn -m gpu -q -p no:cacheprovider > "$DEST/gpu_tests_attn.log" 2>&1
    echo "gpu tests rc $?"; tail -3 "$DEST/gpu_tests_attn.log"
    timeout 200 python3 benchmarks/tuning/next/topk_forms.py > "$DEST/topk_forms.log" 2>&1
    echo "topk_forms rc $?"; tail -2 "$DEST/topk_forms.log" | cut -c1-300
    ;;
  walk)
    timeout 500 python3 benchmarks/tuning/next/walk_coupling.py > "$DEST/walk_coupling.log" 2>&1
    echo "walk_coupling rc $?"; tail -3 "$DEST/walk_coupling.log" | cut -c1-300
    ;;
  *)
    echo "usage: $0 attn|walk" >&2
    exit 2
    ;;
esac
