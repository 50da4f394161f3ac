#!/usr/bin/env bash
# calibration.sh [BUILD_DIR]: what one calibration run (stagec --calibrate) gains.
#
# For five cases on 2 devices (gpt_tiny inference and 1f1b training at seq 16, resnet_small
# inference and training, mnist_cnn training; global batch 8 in 4 microbatches, --profile cpu,
# one profile database shared by all, 1 thread per device), it
#   1. plans with --profile cpu (the profiled instruction costs charged),
#   2. runs that plan, traced: stagerun PLAN --steps $STEPS --trace TRACE --json,
#   3. calibrates: stagec PLAN --calibrate TRACE --profile-db DB,
#   4. plans again (calibrated) and runs that plan again, untraced (a second, independent run),
# and prints one row per case:
#   before: predicted, measured (median step of run 2 without its first step), measured/predicted
#   after:  calibrated prediction, measured (run 4), measured/predicted; and the calibrated
#           prediction against the traced run it was fitted from (trace/pred)
#
# Environment: STEPS (default 10), KEEP=1 keeps the work folder.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
STAGEC=$BUILD/tools/stagec
STAGERUN=$BUILD/tools/stagerun
STEPS=${STEPS:-10}
for tool in "$STAGEC" "$STAGERUN"; do
  [ -x "$tool" ] || { echo "calibration.sh: $tool not built (ninja -C $BUILD stagec stagerun)" >&2; exit 1; }
done
WORK=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "work folder: $WORK" >&2; else trap 'rm -rf "$WORK"' EXIT; fi
DB=$WORK/profile-cpu-1threads.json
M=$ROOT/samples/models
TRAIN=(--train --loss cross-entropy --optimizer adam)

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $STEPS steps per run"
run_case() {
  local name=$1; shift
  local common=(--devices 2 --batch 8 --microbatches 4 "$@" --profile cpu --profile-db "$DB")
  "$STAGEC" "${common[@]}" -o "$WORK/$name.before" >"$WORK/$name.before.txt"
  "$STAGERUN" "$WORK/$name.before" --steps "$STEPS" --threads-per-device 1 --trace "$WORK/$name.trace.json" \
    --json -q | tail -n 1 >"$WORK/$name.before.run.json"
  "$STAGEC" "$WORK/$name.before" --calibrate "$WORK/$name.trace.json" --profile-db "$DB" >"$WORK/$name.calibrate.txt"
  "$STAGEC" "${common[@]}" -o "$WORK/$name.after" >"$WORK/$name.after.txt"
  "$STAGERUN" "$WORK/$name.after" --steps "$STEPS" --threads-per-device 1 --json -q | tail -n 1 >"$WORK/$name.after.run.json"
  echo "$name $WORK/$name"
}
rows=()
rows+=("$(run_case gpt_tiny_inference "$M/gpt_tiny.onnx" --dim seq=16)")
rows+=("$(run_case gpt_tiny_1f1b_training "$M/gpt_tiny.onnx" --dim seq=16 "${TRAIN[@]}" --schedule 1f1b)")
rows+=("$(run_case resnet_small_inference "$M/resnet_small.onnx")")
rows+=("$(run_case resnet_small_training "$M/resnet_small.onnx" "${TRAIN[@]}")")
rows+=("$(run_case mnist_cnn_training "$M/mnist_cnn.onnx" "${TRAIN[@]}")")

python3 - "${rows[@]}" <<'PY'
import json, sys
print("| case | predicted | measured | meas/pred | calibrated prediction | measured again | meas/pred | trace median / calibrated |")
print("|---|---|---|---|---|---|---|---|")
for row in sys.argv[1:]:
    name, base = row.split()
    before = json.load(open(f"{base}.before.run.json"))
    after = json.load(open(f"{base}.after.run.json"))
    plan = json.load(open(f"{base}.after/plan.json"))
    costs = plan.get("instruction_costs", {})
    pred0, meas0 = before["predicted_step_ms"], before["median_step_ms"]
    pred1, meas1 = after["predicted_step_ms"], after["median_step_ms"]
    trace = costs.get("measured_step_ms", float("nan"))
    note = "" if costs.get("source") == "calibration" else " (not calibrated!)"
    print(f"| {name}{note} | {pred0:.3f} ms | {meas0:.3f} ms | {meas0 / pred0:.2f}x | {pred1:.3f} ms | "
          f"{meas1:.3f} ms | {meas1 / pred1:.2f}x | {trace / pred1:.2f}x |")
PY
