#!/usr/bin/env bash
# The GPU run that decides the block-sparse selection rule for checkpoints not trained sparse (docs/sparse-accuracy.md):
# RULER NIAH single / multikey / multivalue and variable tracking at 4K and 8K on SmolLM2-135M-Instruct, greedy,
# SAMPLES_PER_CELL paired samples per (task, length), the adapter geometry (block 64, window 512, top-k 16), the
# Triton kernels (a rule they lack selects with the torch reference). Variants, in order: dense, compression (8, 4)
# for sparse and sparda (the best rule at the same budget that the kernels run, docs/sparse-accuracy.md), the oracle
# on the first ORACLE_SAMPLES of each cell, (8, 4) at top-k 40 (48 blocks: the 8K budget scaled from 4K's 24), (8, 4)
# with DENSE_LAYERS dense (0 and 7: where InfLLM-V2 recalls least; empty: none), the current rule.
#
#   OUT=/path bash scripts/h200_sparse_accuracy.sh
#
# Writes $OUT/grid (scripts/sparse_diagnostics.py's folder: runs/<variant>.json, summary.json, quality/<rule>.json)
# and $OUT/quality_attn.json (the quality/<rule>.json of QUALITY_RULE, the candidate default). No new variant starts
# after TIME_BUDGET seconds, so one sitting ends inside 10 minutes; to finish the grid in another sitting, carry the
# first sitting's grid folder back into the tree and set PREVIOUS to it: its runs are kept, not run again.
set -euo pipefail
: "${OUT:?set OUT to the output folder}"
MODEL=${MODEL:-.carry/smollm2.gguf}
FORECAST=${FORECAST:-adapters/smollm2-135m-instruct}
SAMPLES_FILE=${SAMPLES_FILE:-.carry/ruler_samples.json}
SAMPLES_PER_CELL=${SAMPLES_PER_CELL:-40}
ORACLE_SAMPLES=${ORACLE_SAMPLES:-16}
DENSE_LAYERS=${DENSE_LAYERS-0,7}
QUALITY_RULE=${QUALITY_RULE:-cmp8}
DEFAULT_VARIANTS=sparse.cmp8,sparda.cmp8,oracle@$ORACLE_SAMPLES,sparse.cmp8.topk40,sparda.cmp8.topk40
DEFAULT_VARIANTS+=,sparse.cmp8.dl,sparda.cmp8.dl,sparse,sparda
VARIANTS=${VARIANTS:-$DEFAULT_VARIANTS}
TIME_BUDGET=${TIME_BUDGET:-330}
for f in "$MODEL" "$SAMPLES_FILE"; do
  [ -e "$f" ] || { echo "missing $f (carry it)" >&2; exit 2; }
done
if [ -z "$DENSE_LAYERS" ]; then
  VARIANTS=$(echo "$VARIANTS" | tr ',' '\n' | grep -v '\.dl$' | paste -sd, -)
fi
mkdir -p "$OUT/grid"
if [ -n "${PREVIOUS:-}" ]; then
  cp -r "$PREVIOUS/runs" "$OUT/grid/"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >&2 || true
# EXTRA: more arguments of sparse_diagnostics.py (a CPU trial on a tiny model: --base, --lengths, --tasks, --device)
# shellcheck disable=SC2086
timeout 590 python scripts/sparse_diagnostics.py --model "$MODEL" --forecast "$FORECAST" \
  --samples-file "$SAMPLES_FILE" --samples "$SAMPLES_PER_CELL" --trace-samples 0 --time-budget "$TIME_BUDGET" \
  --dense-layers "$DENSE_LAYERS" --variants "$VARIANTS" --out "$OUT/grid" ${EXTRA:-}
if [ -f "$OUT/grid/quality/$QUALITY_RULE.json" ]; then
  cp "$OUT/grid/quality/$QUALITY_RULE.json" "$OUT/quality_attn.json"
fi
ls -R "$OUT" >&2
