#!/usr/bin/env bash
# Forward-only pipelining on the CPU backend: measured against predicted.
#
# For each model and each microbatch count M in $MICROBATCHES (batch fixed):
#   1 device    stagec MODEL -o P1 --devices 1 --microbatches M --batch B [...]
#   2 devices   stagec MODEL -o P2 --devices 2 --microbatches M --batch B [...]
#               (stagec picks the cut; inference schedule)
#   both run as stagerun PLAN --steps $STEPS --json --threads-per-device 1 (synthetic input):
#   each device is one worker thread with 1 kernel thread, so the 2-device plan uses 2 cores.
# Plans are made with --profile cpu (the op times the planner and the simulator use are the CPU
# backend's kernels measured at the microbatch shape, 1 thread; profile database $PROFILE_DB),
# or, when this stagec has no --profile, with the analytic --device-spec cpu (said in the
# output).
# Reported per row:
#   step ms        measured: median of steps 2..$STEPS (the first is warm-up);
#                  predicted: the plan's simulated step (stagerun --json predicted_step_ms)
#   speed-up       1-device step / 2-device step, both at the same M ("same M": the pipelining
#                  alone) and against the 1-device plan at M=1 (whole batch in one go: what
#                  splitting the batch costs in kernel efficiency is charged to the pipeline);
#                  measured and predicted
#   bubble         of the 2-device run: measured by stagerun (idle share of the devices' time
#                  in the median step) and predicted by the simulator
#   cores obtained (user + system CPU time) / wall time of each stagerun process (loading
#                  included): about 1 for the 1-device runs and up to 2 for the 2-device runs
#                  on an idle machine; a 2-device figure near 1 means other processes held the
#                  second core, and the measured speed-up says nothing about the pipeline then
# Models: resnet50 (torchvision ResNet-50, batch 16, 3x224x224) and gpt (the export script's
# GPT-style decoder, batch 16, --dim seq=128); ONNX files from $MODELS (exported there by
# samples/scripts/export_torch_models.py when missing and PyTorch is available).
#
# The machine may be shared: figures are medians over steps; the load average is printed
# before and after. Two devices on a 2-core machine leave nothing for anyone else, so other
# load there slows the 2-device runs more than the 1-device ones.
#
# Usage (from the repo root, after bash tools/build.sh):
#   bash bench/pipeline_sweep.sh
# Environment: BUILD=build, STEPS=7, MICROBATCHES="1 2 4 8 16", SWEEP_MODELS="resnet50 gpt",
#   CACHE=${XDG_CACHE_HOME:-~/.cache}/stagecraft-bench, MODELS=$CACHE/torch-models,
#   PROFILE_DB=(a fresh file per run; set it to reuse measured op times), PY=/usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-7}
MICROBATCHES=${MICROBATCHES:-"1 2 4 8 16"}
SWEEP_MODELS=${SWEEP_MODELS:-"resnet50 gpt"}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stagecraft-bench}
MODELS=${MODELS:-$CACHE/torch-models}
PY=${PY:-/usr/bin/python3}
BATCH=16
SEQ=128
stagec=$BUILD/tools/stagec
stagerun=$BUILD/tools/stagerun
for t in "$stagec" "$stagerun"; do
  [[ -x $t ]] || { echo "pipeline_sweep.sh: $t not built (bash tools/build.sh, or set BUILD)" >&2; exit 1; }
done
(( STEPS >= 2 )) || { echo "pipeline_sweep.sh: STEPS must be at least 2" >&2; exit 2; }
exec 3>&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PROFILE_DB=${PROFILE_DB:-$work/profile-cpu-1threads.json}

if "$stagec" --help 2>/dev/null | grep -q -- '--profile '; then
  cost=(--profile cpu --profile-threads 1 --profile-db "$PROFILE_DB")
  cost_note="--profile cpu (measured op times, 1 thread; db $PROFILE_DB)"
else
  cost=(--device-spec cpu)
  cost_note="--device-spec cpu (analytic roofline: this stagec has no --profile)"
fi

median_after_first() {  # stagerun --json (JSON Lines) on stdin -> median of the summary's step_ms[1:]
  jq 'select(.type == "summary") | [.step_ms[1:][]] | sort | if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end'
}
f1() { printf "%.1f" "$1"; }
f2() { printf "%.2f" "$1"; }
pct() { printf "%.1f%%" "$(echo "$1 * 100" | bc -l)"; }

echo "# forward pipelining: 2 devices x 1 thread vs 1 device x 1 thread"
echo
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1);" \
     "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- stagecraft: $BUILD ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || echo '?'))," \
     "git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+local changes')"
echo "- plans: $cost_note; inference schedule; batch $BATCH"
echo "- measured: median of $((STEPS - 1)) steps after a warm-up step, stagerun --threads-per-device 1"
echo

mkdir -p "$MODELS"
rows=()
for m in $SWEEP_MODELS; do
  model=$MODELS/$m.onnx
  if [[ ! -f $model ]] && "$PY" -c "import torch, torchvision" 2>/dev/null; then
    "$PY" samples/scripts/export_torch_models.py "$MODELS" "$m" 2>&1 | grep -v -i warn || true
  fi
  if [[ ! -f $model ]]; then
    echo "note: $model missing (and PyTorch unavailable to export it): $m skipped"
    continue
  fi
  dims=()
  shape="$m b$BATCH"
  if [[ $m == gpt ]]; then dims=(--dim seq=$SEQ); shape="$m b$BATCH seq$SEQ"; fi
  base_meas="" base_pred=""
  for mb in $MICROBATCHES; do
    if (( BATCH % mb != 0 )); then echo "note: M=$mb does not divide batch $BATCH: skipped"; continue; fi
    for d in 1 2; do
      "$stagec" "$model" -o "$work/$m.$mb.$d" --devices $d --microbatches "$mb" --batch $BATCH "${dims[@]}" \
        "${cost[@]}" > "$work/$m.$mb.$d.stagec.txt" 2> "$work/stagec.err" || { cat "$work/stagec.err" >&2; exit 1; }
      TIMEFORMAT='%R %U %S'
      { time "$stagerun" "$work/$m.$mb.$d" --steps "$STEPS" --json --threads-per-device 1 -q \
          > "$work/$m.$mb.$d.json" 2> "$work/stagerun.err" || { cat "$work/stagerun.err" >&3; exit 1; }; } \
        2> "$work/$m.$mb.$d.time"
    done
    meas1=$(median_after_first < "$work/$m.$mb.1.json")
    meas2=$(median_after_first < "$work/$m.$mb.2.json")
    pred1=$(jq 'select(.type == "summary") | .predicted_step_ms' "$work/$m.$mb.1.json")
    pred2=$(jq 'select(.type == "summary") | .predicted_step_ms' "$work/$m.$mb.2.json")
    if [[ -z $base_meas ]]; then base_meas=$meas1 base_pred=$pred1 base_mb=$mb; fi
    cut=$("$BUILD/tools/stagedump" "$work/$m.$mb.2" --json | jq -r '.stages | map("\(.nodes)") | join("+")')
    cores1=$(awk '{printf "%.2f", ($2 + $3) / $1}' "$work/$m.$mb.1.time")
    cores2=$(awk '{printf "%.2f", ($2 + $3) / $1}' "$work/$m.$mb.2.time")
    bub_m=$(jq 'select(.type == "summary") | .bubble.measured' "$work/$m.$mb.2.json")
    bub_p=$(jq 'select(.type == "summary") | .bubble.predicted' "$work/$m.$mb.2.json")
    rows+=("| $shape | $mb | $((BATCH / mb)) | $cut | $(f1 "$meas1") / $(f1 "$pred1") | $(f1 "$meas2") / $(f1 "$pred2") |"\
" $(f2 "$(echo "$meas1 / $meas2" | bc -l)") / $(f2 "$(echo "$pred1 / $pred2" | bc -l)") |"\
" $(f2 "$(echo "$base_meas / $meas2" | bc -l)") / $(f2 "$(echo "$base_pred / $pred2" | bc -l)") |"\
" $(pct "$bub_m") / $(pct "$bub_p") | $cores1 / $cores2 |")
  done
done
echo "| model | M | microbatch | ops per stage | 1 device step ms, measured / predicted | 2 devices step ms, measured / predicted | speed-up, same M, measured / predicted | speed-up vs 1 device at M=${base_mb:-1}, measured / predicted | bubble (2 devices), measured / predicted | cores obtained, 1 / 2 devices |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
