#!/usr/bin/env bash
# The predicted peak per device against the measured one (issue 16: one memory figure), on
# every sample: inference, and training under each schedule, 2 devices, 4 microbatches of 2.
# The measured peak is stagerun's memory meter (every tensor the device holds); the predicted
# one is plan.json's. Prints one row per plan: per device, measured / predicted KiB and the
# difference (measured - predicted; negative: under the prediction).
#
# Usage (repo root, after bash tools/build.sh):  bash bench/memory_bound.sh
# Environment: BUILD=build, STEPS=4.
set -euo pipefail
BUILD=${BUILD:-build}
STEPS=${STEPS:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
row() {  # NAME STAGEC-ARGS...
  local name=$1
  shift
  "$BUILD/tools/stagec" "$@" -o "$work/$name" --device-spec cpu >/dev/null
  "$BUILD/tools/stagerun" "$work/$name" --steps "$STEPS" --json -q >"$work/$name.json"
  python3 - "$work/$name.json" "$name" <<'PY'
import json, sys
summary = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
cells = " | ".join(f"{d['peak_bytes'] / 1024:.1f} / {d['predicted_peak_bytes'] / 1024:.1f} "
                   f"({(d['peak_bytes'] - d['predicted_peak_bytes']) / 1024:+.1f})"
                   for d in summary["device"])
print(f"| {sys.argv[2]} | {cells} |")
PY
}
echo "| plan | device 0 KiB measured / predicted (diff) | device 1 |"
echo "|---|---|---|"
for m in gpt_tiny toy mnist_cnn resnet_small; do
  args=(samples/models/$m.onnx --devices 2 --microbatches 4 --batch 8)
  loss=(--loss mse)
  [ $m = gpt_tiny ] && args+=(--dim seq=32) && loss=(--loss cross-entropy)
  row "${m} inference" "${args[@]}"
  for schedule in gpipe 1f1b interleaved zb-h1; do
    chunks=()
    [ $schedule = interleaved ] && chunks=(--chunks 2)
    [ $m = toy ] && [ $schedule = interleaved ] && continue  # 3 ops: too few for 4 stages
    row "${m} ${schedule}" "${args[@]}" --schedule $schedule "${chunks[@]}" --train \
      --optimizer adam "${loss[@]}"
  done
done
