#!/usr/bin/env bash
# profile_accuracy.sh [BUILD_DIR]: how well plans made with measured CPU profiles
# (stagec --profile cpu) predict what stagerun measures on this machine.
#
# For samples/models/{toy,mnist_cnn,resnet_small,gpt_tiny}.onnx (gpt: --dim seq=16), on 1 and 2
# devices, global batch 8 in 4 microbatches (inference), it
#   1. plans with --profile cpu (one profile database shared by all runs, 1 thread),
#   2. plans the same with the analytic roofline of the cpu preset (--dry-run), for reference,
#   3. runs the plan: stagerun PLAN --steps $STEPS --json --threads-per-device 1,
# and prints one row per plan:
#   roofline    predicted step of the roofline(cpu) plan (ms)
#   predicted   predicted step of the measured-profile plan (ms)
#   measured    stagerun's median step (ms); meas/pred their ratio
#   busy        per device: predicted compute (sum of the stage's profiled op times x microbatches)
#               -> measured compute in the median step (ms)
#   peak        per device: predicted peak (plan.predicted.device_peak_bytes) / its stages'
#               anatomies added up (plan.json stages[].memory) -> stagerun's peak_bytes (KiB)
#
# Environment: STEPS (default 20), PROFILE_DB (default: a fresh database in a temporary folder,
# so every signature is measured on this machine now), KEEP=1 keeps the work folder.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
STAGEC=$BUILD/tools/stagec
STAGERUN=$BUILD/tools/stagerun
STEPS=${STEPS:-20}
for tool in "$STAGEC" "$STAGERUN"; do
  [ -x "$tool" ] || { echo "profile_accuracy.sh: $tool not built (ninja -C $BUILD stagec stagerun)" >&2; exit 1; }
done
WORK=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "work folder: $WORK" >&2; else trap 'rm -rf "$WORK"' EXIT; fi
DB=${PROFILE_DB:-$WORK/profile-cpu-1threads.json}

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $STEPS steps; profile db $DB"
rows=()
for model in toy mnist_cnn resnet_small gpt_tiny; do
  extra=()
  [ "$model" = gpt_tiny ] && extra=(--dim seq=16)
  for devices in 1 2; do
    plan=$WORK/${model}_p${devices}
    common=("$ROOT/samples/models/$model.onnx" --devices "$devices" --batch 8 --microbatches 4 "${extra[@]}")
    "$STAGEC" "${common[@]}" -o "$plan" --profile cpu --profile-db "$DB" >"$plan.stagec.txt"
    "$STAGEC" "${common[@]}" --dry-run --device-spec cpu >"$plan.roofline.txt"
    "$STAGERUN" "$plan" --steps "$STEPS" --json --threads-per-device 1 >"$plan.run.json"
    rows+=("$model $devices $plan")
  done
done

python3 - "${rows[@]}" <<'PY'
import json, re, sys
print(f"{'model':<13} {'P':>1} {'roofline':>9} {'predicted':>9} {'measured':>9} {'meas/pred':>9}  "
      f"{'busy ms pred -> meas (per device)':<36} peak KiB pred / anatomy -> meas (per device)")
for row in sys.argv[1:]:
    model, devices, plan = row.split()
    p = json.load(open(f"{plan}/plan.json"))
    r = json.loads(open(f"{plan}.run.json").read().splitlines()[-1])  # the summary record
    text = open(f"{plan}.roofline.txt").read()
    roof = float(re.search(r"predicted: +step ([0-9.]+) ms", text).group(1))
    pred, meas = r["predicted_step_ms"], r["median_step_ms"]
    busy, peak = [], []
    for d, dev in enumerate(r["device"]):
        anatomy = sum(sum(s["memory"].values()) for s in p["stages"] if s["device"] == d)
        busy.append(f"{p['predicted']['device_busy_ms'][d]:.3f}->{dev['busy_fraction'] * meas:.3f}")
        peak.append(f"{dev['predicted_peak_bytes'] / 1024:.0f}/{anatomy / 1024:.0f}->{dev['peak_bytes'] / 1024:.0f}")
    print(f"{model:<13} {devices:>1} {roof:>9.3f} {pred:>9.3f} {meas:>9.3f} {meas / pred:>8.2f}x  "
          f"{'  '.join(busy):<36} {'  '.join(peak)}")
PY
