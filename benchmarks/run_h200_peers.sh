#!/usr/bin/env bash
# Every peer at its best on the H200, time-boxed for one device call (plus a short one before it when a bundle
# travels in two parts). Results under $OUT: the logs and results.tgz (topk_forms.json, and
# bench/results/{gdn_core,model}.json merged into copies of the tracked ones, with their plots) - at most 8 files, as
# no more come back.
#
#   bash benchmarks/run_h200_peers.sh stash               # call 1 (seconds): keep .peers/*.part00 in /tmp/stash
#   bash benchmarks/run_h200_peers.sh                     # call 2: install, then topk, gdn, model (this order)
#   bash benchmarks/run_h200_peers.sh stash topk model    # or: call 1 stashes and runs two pieces, call 2 the third
#   bash benchmarks/run_h200_peers.sh gdn                 #     (what call 1 installed in /tmp is used again)
#   MODEL_PREFILL=1 bash benchmarks/run_h200_peers.sh model   # decode, then prefill at 128K with causal-conv1d
#   DRY_RUN=1 bash benchmarks/run_h200_peers.sh           # any CPU: installs, argument checks, tiny model run
#
# Pieces, each under `timeout` and given what is left of the call's DEADLINE (default 530 s) when it starts; a
# piece's rows are written as they finish, so a cut piece keeps them:
#   topk   the top-k forms' GPU test, then benchmarks/tuning/next/topk_forms.py (~2-3 min)      -> topk_forms.json
#   gdn    longsparse bench gdn at 32K and 128K, B = 1: ours against FLA, FlashQLA and FlashInfer, every row checked
#          against the specification and every peer against the fp32 dense reference (~2.5-3.5 min) -> gdn_core.json
#   model  longsparse bench model, Qwen3.5-4B, decode at 32K, batch 16: transformers eager, ours dense (the checks'
#          reference) and InfLLM-V2, then transformers compiled over its static cache, last because its compilation
#          is the one unknown (~3-5 min); with MODEL_PREFILL=1 then prefill at 128K too (+1-2 min)  -> model.json
#
# causal-conv1d (transformers' fast short convolution; PyPI has only its sdist) is built for sm_90 in the background
# of any call that carries the sdist, in a session of its own, so that it goes on between back-to-back calls on a
# warm machine (its backward kernels alone take ~11 minutes of one core: docs/benchmark-model.md); the model piece
# uses it if it has finished, and otherwise stops it when MODEL_PREFILL=1 (its rows then say why transformers ran
# without it).
#
# What the calls carry (ignored paths, `carry`): .peers holding peers-py312.tar.xz (FLA, FlashQLA, TileLang:
# `python -m longsparse.bench.peers bundle`), the FlashInfer bundle, in parts if it must (`bundle ... --part-mib N`:
# .part00 in call 1, kept by `stash`, the rest in call 2), and causal_conv1d-<version>.tar.gz if it is to be built
# (best in the first call). Set LONGSPARSE_GIT_COMMIT to the local HEAD (the device's copy of the tree carries stale
# git metadata).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
DEADLINE=${DEADLINE:-530}
CC_BUILD_S=${CC_BUILD_S:-900}
CC_LOG=/tmp/causal_conv1d.log
DEST=${OUT:-.out}
WORK=${WORK:-/tmp/run_h200_peers}
DRY=${DRY_RUN:-0}
mkdir -p "$DEST" "$WORK/bench/results"
cp benchmarks/results/gdn_core.json benchmarks/results/model.json "$WORK/bench/results/" 2>/dev/null  # --append
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0 HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
LOG="$DEST/run.log"

say() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
# run NAME CAP CMD...: at most CAP seconds and never past the deadline (less 15 s for packing the results)
run() {
  local name=$1 cap=$2
  shift 2
  local t=$(( $(left) - 15 ))
  (( t > cap )) && t=$cap
  if (( t < 30 )); then say "$name: skipped, ${t}s left"; return; fi
  say "$name: start (${t}s at most)"
  timeout --signal=INT --kill-after=10 "$t" "$@" > "$DEST/$name.log" 2>&1
  say "$name: rc $? ($(tail -1 "$DEST/$name.log" | cut -c1-200))"
}

install_bundles() {
  if [ -f .peers/peers-py312.tar.xz ]; then
    eval "$($PY -m longsparse.bench.peers install .peers/peers-py312.tar.xz /tmp/peers | tail -1)"
    say "peers installed (FLA, FlashQLA): $(du -sh /tmp/peers | cut -f1)"
  elif [ -d /tmp/peers/fla ]; then  # installed by the call before, on this machine
    export PYTHONPATH="/tmp/peers:$PYTHONPATH"
    say "peers as the previous call installed them in /tmp/peers"
  else
    say "no .peers/peers-py312.tar.xz: FLA and FlashQLA will be missing (and transformers runs its torch GDN)"
  fi
  local parts=(/tmp/stash/flashinfer-py312.tar.xz.part* .peers/flashinfer-py312.tar.xz.part* .peers/flashinfer-py312.tar.xz)
  local have=() names=" "
  for p in "${parts[@]}"; do  # each part once (a stashed part00 may also still be in .peers)
    [ -f "$p" ] && [[ "$names" != *" $(basename "$p") "* ]] && have+=("$p") && names+="$(basename "$p") "
  done
  if (( ${#have[@]} == 1 )) && [[ "${have[0]}" == *.part00 ]]; then
    say "FlashInfer: only its first part is here (kept in /tmp/stash for the next call)"
    return
  fi
  if (( ${#have[@]} == 0 )) && [ -d /tmp/flashinfer/flashinfer ]; then
    eval "$($PY -c 'import sys; from longsparse.bench.peers import import_paths; print("export PYTHONPATH=" + ":".join(map(str, import_paths(sys.argv[1]))) + ":$PYTHONPATH")' /tmp/flashinfer)"
    say "FlashInfer as the previous call installed it in /tmp/flashinfer"
  elif (( ${#have[@]} )); then
    if out=$($PY -m longsparse.bench.peers install "${have[@]}" /tmp/flashinfer 2>&1); then
      eval "$(echo "$out" | tail -1)"
      say "FlashInfer installed from ${have[*]}: $(du -sh /tmp/flashinfer | cut -f1)"
      rm -f /tmp/stash/flashinfer-py312.tar.xz.part*  # consumed: a later call on this machine uses /tmp/flashinfer
    else
      say "FlashInfer bundle did not install from ${have[*]}: $(echo "$out" | tail -1 | cut -c1-200)"
    fi
  else
    say "no FlashInfer bundle: bench gdn records flashinfer as missing"
  fi
}

# causal-conv1d from its sdist, for sm_90 alone (its setup.py compiles for nine architectures whatever
# TORCH_CUDA_ARCH_LIST says), into /tmp/causal_conv1d; $CC_LOG's last line says how long it took or why it failed.
build_causal_conv1d() {
  exec >> "$CC_LOG" 2>&1  # this runs as a process of its own (setsid bash -c)
  local sdist t0=$(date +%s)
  sdist=$(ls .peers/causal_conv1d-*.tar.gz | head -1)
  fail() { echo "$1"; rm -f /tmp/causal_conv1d.pid; exit 1; }
  rm -rf /tmp/cc-src /tmp/causal_conv1d.partial && mkdir -p /tmp/cc-src \
    && tar -xzf "$sdist" -C /tmp/cc-src --strip-components=1 || fail "the sdist $sdist did not unpack"
  $PY - /tmp/cc-src/setup.py <<'EOF' || fail "its setup.py changed: the gencode list was not narrowed to sm_90"
import re, sys
path = sys.argv[1]
text = open(path).read()
kept = re.sub(r'cc_flag\.append\("-gencode"\)\s*\n\s*cc_flag\.append\("arch=compute_(?!90,)\d+,code=sm_\d+"\)\s*\n', "", text)
if "arch=compute_90,code=sm_90" not in kept or kept.count('cc_flag.append("-gencode")') != 1:
    raise SystemExit(1)
open(path, "w").write(kept)
EOF
  CAUSAL_CONV1D_FORCE_BUILD=TRUE TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-4} CUDA_HOME=/usr/local/cuda \
    PATH=/usr/local/cuda/bin:$PATH nice -n 10 timeout "$CC_BUILD_S" $PY -m pip install -q --no-build-isolation \
    --no-deps --no-index --target /tmp/causal_conv1d.partial /tmp/cc-src \
    || fail "the sm_90 build failed or ran past ${CC_BUILD_S} s, after $(( $(date +%s) - t0 )) s (see above)"
  mv /tmp/causal_conv1d.partial /tmp/causal_conv1d && rm -f /tmp/causal_conv1d.pid
  echo "built for sm_90 in $(( $(date +%s) - t0 )) s"
}

pack() {
  [ -f "$CC_LOG" ] && cp "$CC_LOG" "$DEST/causal_conv1d.log"
  tar czf "$DEST/results.tgz" -C "$WORK" .
  say "done; $DEST: $(ls "$DEST" | tr '\n' ' ')"
}

if [ "$DRY" != 1 ] && ls .peers/causal_conv1d-*.tar.gz > /dev/null 2>&1 && [ ! -d /tmp/causal_conv1d ] \
   && [ ! -f /tmp/causal_conv1d.pid ]; then  # built at most once per machine, across calls
  export -f build_causal_conv1d
  export PY CC_BUILD_S CC_LOG
  setsid bash -c build_causal_conv1d > /dev/null 2>&1 &
  echo $! > /tmp/causal_conv1d.pid
  say "causal-conv1d: building for sm_90 in the background (log in causal_conv1d.log)"
fi
pieces=("$@")
if [ "${pieces[0]:-}" = stash ]; then  # a bundle's first part, carried by this call, kept for the next one
  mkdir -p /tmp/stash && cp .peers/*.part00 /tmp/stash/ 2>/dev/null
  say "stashed: $(ls /tmp/stash 2>/dev/null | tr '\n' ' ')"
  pieces=("${pieces[@]:1}")
  (( ${#pieces[@]} )) || exit 0
fi
(( ${#pieces[@]} )) || pieces=(topk gdn model)
$PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' | tee -a "$LOG"
want_peers=0
for p in "${pieces[@]}"; do
  [ "$p" = model ] || [ "$p" = gdn ] && want_peers=1
done
(( want_peers )) && install_bundles

for piece in "${pieces[@]}"; do
  case $piece in
    topk)
      if [ "$DRY" = 1 ]; then
        run topk_forms 900 env TRITON_INTERPRET=1 OUT="$WORK" $PY benchmarks/tuning/next/topk_forms.py --dry-run
      else
        run topk_gpu_test 75 $PY -m pytest -q -x -p no:cacheprovider tests/ops/sparse_attn/test_gpu.py \
          -k top_k_forms_select_what_the_default_selects
        run topk_forms 200 env OUT="$WORK" $PY benchmarks/tuning/next/topk_forms.py
      fi
      ;;
    gdn)
      args=(bench --out "$WORK/bench" gdn --append --lengths 32768,131072 --batches '' --rounds 3)
      if [ "$DRY" = 1 ]; then
        run gdn 120 $PY -c 'import sys; from longsparse.cli import build_parser; print(build_parser().parse_args(sys.argv[1:]))' "${args[@]}"
      else
        run gdn 220 $PY -m longsparse.cli "${args[@]}"
      fi
      ;;
    model)
      cc_pid=$(cat /tmp/causal_conv1d.pid 2>/dev/null)
      if [ -n "$cc_pid" ] && kill -0 "$cc_pid" 2>/dev/null; then
        if [ "${MODEL_PREFILL:-0}" = 1 ]; then  # the prefill rows run now: stop it, keep the call's time
          kill -- -"$cc_pid" 2>/dev/null
          rm -f /tmp/causal_conv1d.pid
          echo "the sm_90 build was still compiling when the model piece started and was stopped" >> "$CC_LOG"
        else
          echo "the sm_90 build was still compiling when the model piece started" >> "$CC_LOG"
        fi
      fi
      note=$(tail -1 "$CC_LOG" 2>/dev/null || echo "its sdist was not carried (PyPI has no wheel)")
      say "causal-conv1d: $note"
      if [ -d /tmp/causal_conv1d/causal_conv1d ]; then export PYTHONPATH="/tmp/causal_conv1d:$PYTHONPATH"; fi
      args=(bench --out "$WORK/bench" model --append --decode-first --modes hf,dense,sparse,hf_compiled --reps 1
            --no-breakdown --fp32-check-len 0 --hf-conv-note "causal-conv1d could not be installed: $note")
      [ "${MODEL_PREFILL:-0}" = 1 ] || [ "$DRY" = 1 ] || args+=(--phase decode)
      if [ "$DRY" = 1 ]; then  # the CPU has FLA installed, whose kernels transformers would call there: hide it
        args+=(--geometry tiny-qwen3.5 --lengths 97 --contexts 81 --batches 3 --device cpu --decode-steps 2)
        run model 600 $PY -c 'import sys; sys.modules["fla"] = None; from longsparse.cli import main; sys.exit(main(sys.argv[1:]))' "${args[@]}"
      else
        args+=(--geometry qwen3.5-4b --lengths 131072 --contexts 32768 --batches 16 --decode-steps 8)
        run model 400 $PY -m longsparse.cli "${args[@]}"
      fi
      ;;
    *) say "unknown piece: $piece (topk, gdn, model)"; exit 2 ;;
  esac
done
pack
