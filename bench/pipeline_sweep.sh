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
# With SWEEP=cuts it sweeps cut points instead (see sweep_cuts below): predicted against
# measured step per cut point, Kendall's tau between them, and how the planner's choice ranks.
#
# Usage (from the repo root, after bash tools/build.sh):
#   bash bench/pipeline_sweep.sh
#   SWEEP=cuts bash bench/pipeline_sweep.sh
# Environment: BUILD=build, STEPS=7, MICROBATCHES="1 2 4 8 16", SWEEP_MODELS="resnet50 gpt",
#   SWEEP=microbatches|cuts, CUT_MODEL=samples/models/resnet_small.onnx,
#   CUT_ARGS="--batch 8 --microbatches 4", CUT_STRIDE=4,
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

# grep without -q reads all of --help: with -q it exits at the first match, stagec gets SIGPIPE
# and, under pipefail, the test fails at random (the sweep then fell back to the roofline).
if "$stagec" --help 2>/dev/null | grep -- '--profile ' >/dev/null; then
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

# SWEEP=cuts: the ranking of cut points (issue 33). One bundled sample ($CUT_MODEL, $CUT_ARGS)
# on 2 devices, planned once as stagec chooses and then with --split-after at every
# $CUT_STRIDE-th node of its --list-nodes order (and the planner's own cut), each run as above
# ($STEPS steps). Per cut point: the predicted step (plan.json's simulated step, stagerun's
# predicted_step_ms) and the measured one, the median of the steps after the warm-up and their
# fastest (other processes only ever add time, so on a shared machine the fastest step is the
# steadier figure), with their ranks; then Kendall's tau-b between predicted and each measured
# figure over all cut points (1: the same order, 0: no relation, -1: reversed), and whether the
# planner's choice is the measured best or within 3% of it. Only grep, sed and awk read the
# outputs (no jq, bc or python3).
field() {  # the number after "KEY": on the summary line of a stagerun --json file
  grep '"type":"summary"' "$2" | sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p"
}
fastest_after_first() {  # the least of the summary's step_ms after the first (the warm-up)
  grep '"type":"summary"' "$1" | sed -n 's/.*"step_ms":\[\([^]]*\)\].*/\1/p' |
    awk -F, '{ m = $2; for (i = 3; i <= NF; ++i) if ($i + 0 < m + 0) m = $i; print m }'
}
sweep_cuts() {
  local model=${CUT_MODEL:-samples/models/resnet_small.onnx}
  local args=(${CUT_ARGS:---batch 8 --microbatches 4})
  local stride=${CUT_STRIDE:-4}
  echo "# cut points: predicted against measured step, 2 devices"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc) cores; uptime before: $(uptime)"
  echo "- stagecraft: git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+local changes')"
  echo "- model: $model ${args[*]}; plans: $cost_note; inference schedule; cuts after every ${stride}-th node of --list-nodes and the planner's"
  echo "- measured: stagerun --steps $STEPS --threads-per-device 1: median_step_ms (the steps after the warm-up) and the fastest of those steps"
  echo
  "$stagec" "$model" -o "$work/chosen" --devices 2 "${args[@]}" "${cost[@]}" >/dev/null 2>"$work/stagec.err" ||
    { cat "$work/stagec.err" >&2; exit 1; }
  local chosen
  chosen=$(grep -A1 '"split_after"' "$work/chosen/plan.json" | sed -n '2{s/[ ",]//g;p;}')
  local nodes
  nodes=$("$stagec" "$model" "${args[@]}" --list-nodes | awk -v s="$stride" -v c="$chosen" \
    '{ n[NR] = $1 } END { for (i = 1; i < NR; ++i) if (i % s == 0 || n[i] == c) print n[i] }')
  : > "$work/cuts.tsv"
  local i=0 node
  for node in $nodes; do
    i=$((i + 1))
    "$stagec" "$model" -o "$work/cut.$i" --devices 2 "${args[@]}" --split-after "$node" "${cost[@]}" \
      >/dev/null 2>"$work/stagec.err" || { echo "note: --split-after $node refused: $(head -1 "$work/stagec.err")"; continue; }
    "$stagerun" "$work/cut.$i" --steps "$STEPS" --json --threads-per-device 1 -q >"$work/cut.$i.json" \
      2>"$work/stagerun.err" || { cat "$work/stagerun.err" >&2; exit 1; }
    printf '%s\t%s\t%s\t%s\n' "$node" "$(field predicted_step_ms "$work/cut.$i.json")" \
      "$(field median_step_ms "$work/cut.$i.json")" "$(fastest_after_first "$work/cut.$i.json")" \
      >> "$work/cuts.tsv"
  done
  awk -F'\t' -v chosen="$chosen" '
    { node[NR] = $1; pred[NR] = $2 + 0; meas[NR] = $3 + 0; fast[NR] = $4 + 0 }
    function rank(v, i,   r, j) { r = 1; for (j = 1; j <= NR; ++j) if (v[j] < v[i]) ++r; return r }
    function sign(x) { return x > 0 ? 1 : x < 0 ? -1 : 0 }
    # Kendall tau-b of pred against v: (concordant - discordant) pairs over
    # sqrt((pairs - ties in pred) (pairs - ties in v)).
    function tau(v, what,   i, j, s, c, d, tp, tv, pairs) {
      for (i = 1; i <= NR; ++i) for (j = i + 1; j <= NR; ++j) {
        ++pairs; s = sign(pred[i] - pred[j]) * sign(v[i] - v[j])
        if (s > 0) ++c; else if (s < 0) ++d
        if (pred[i] == pred[j]) ++tp
        if (v[i] == v[j]) ++tv
      }
      if (pairs - tp > 0 && pairs - tv > 0)
        printf "- Kendall tau-b, predicted vs %s over %d cut points: %.3f (%d concordant, %d discordant pairs)\n",
               what, NR, (c - d) / sqrt((pairs - tp) * (pairs - tv)), c, d
    }
    # How the cut the planner chose (row mine) ranks by v.
    function choice(v, what,   i, best, gap, verdict) {
      best = 1
      for (i = 1; i <= NR; ++i) if (v[i] < v[best]) best = i
      gap = (v[mine] - v[best]) / v[best] * 100
      if (mine == best) verdict = "the planner chose the best"
      else if (gap <= 3) verdict = sprintf("within 3%% of the best (%.1f%% slower)", gap)
      else verdict = sprintf("NOT within 3%% of the best (%.1f%% slower)", gap)
      printf "- by the %s: the planner cut %.2f ms, the best (after %s) %.2f ms: %s\n", what,
             v[mine], node[best], v[best], verdict
    }
    END {
      print "| cut after | predicted step ms | measured median step ms | measured fastest step ms | predicted rank | median rank | fastest rank |"
      print "|---|---|---|---|---|---|---|"
      for (i = 1; i <= NR; ++i) {
        if (node[i] == chosen) mine = i
        printf "| %s%s | %.2f | %.2f | %.2f | %d | %d | %d |\n", node[i], node[i] == chosen ? " (planner)" : "",
               pred[i], meas[i], fast[i], rank(pred, i), rank(meas, i), rank(fast, i)
      }
      print ""
      tau(meas, "measured median")
      tau(fast, "measured fastest")
      if (mine) {
        printf "- the planner cuts after %s\n", chosen
        choice(meas, "median step")
        choice(fast, "fastest step")
      }
    }' "$work/cuts.tsv"
  echo
  echo "- uptime after: $(uptime)"
}
if [[ ${SWEEP:-microbatches} == cuts ]]; then
  sweep_cuts
  exit 0
fi

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
