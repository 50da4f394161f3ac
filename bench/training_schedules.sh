#!/usr/bin/env bash
# Pipelined training of a GPT-style model on 2 CPU devices (1 thread each): each schedule's
# measured step and bubble (stagerun, median of the steps after the first) beside the
# simulator's prediction (plan.json, from --profile cpu op times: forward and, with --train, the
# gradient ops autodiff writes, input- and weight-gradient parts timed apart; the roofline's
# backward/forward ratio only for a gradient op the backend lacks, which stagec reports).
#
# Usage (repo root, after bash tools/build.sh):  bash bench/training_schedules.sh
# Environment: BUILD=build, MODEL=samples/models/gpt_tiny.onnx, SEQ=64, BATCH=16, M=8, STEPS=8.
set -euo pipefail
BUILD=${BUILD:-build}
MODEL=${MODEL:-samples/models/gpt_tiny.onnx}
SEQ=${SEQ:-64}
BATCH=${BATCH:-16}
M=${M:-8}
STEPS=${STEPS:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $MODEL batch $BATCH seq $SEQ, $M microbatches, $STEPS steps"
echo
echo "| schedule | measured step ms | predicted step ms | measured bubble | predicted bubble | final loss |"
echo "|---|---|---|---|---|---|"
for schedule in gpipe 1f1b interleaved zb-h1; do
  extra=()
  [ "$schedule" = interleaved ] && extra=(--chunks 2)
  "$BUILD/tools/stagec" "$MODEL" -o "$work/$schedule" --devices 2 --train --loss cross-entropy --optimizer adam \
    --lr 0.01 --batch "$BATCH" --microbatches "$M" --dim seq="$SEQ" --schedule "$schedule" "${extra[@]}" \
    --profile cpu --profile-db "$work/profile.json" >/dev/null
  "$BUILD/tools/stagerun" "$work/$schedule" --steps "$STEPS" --json -q | tail -n 1 >"$work/$schedule.json"
  python3 - "$work/$schedule.json" "$schedule" <<'PY'
import json, statistics, sys
j = json.load(open(sys.argv[1]))
steps = j["step_ms"][1:] or j["step_ms"]
print(f"| {sys.argv[2]} | {statistics.median(steps):.2f} | {j['predicted_step_ms']:.2f} | "
      f"{100 * j['bubble']['measured']:.1f}% | {100 * j['bubble']['predicted']:.1f}% | {j['final_loss']:.4f} |")
PY
done
