#!/usr/bin/env bash
# handoff.sh [BUILD_DIR]: what the hand-offs between pipeline devices cost a step, measured.
#
# Plans the five cases of calibration.sh (2 devices, batch 8 in 4 microbatches, --profile cpu,
# one thread per device: gpt_tiny inference and 1f1b training at seq 16, resnet_small inference
# and training, mnist_cnn training) and runs each plan ROUNDS times (default 3) under every
# variant, the variants interleaved so that the machine's drift falls on all of them alike:
#   sleep  stagerun as it is (a waiting worker sleeps at once, woken by the kernel)
#   spin   stagerun --spin-us $SPIN_US (default 200: a waiting worker watches before it sleeps)
#   base   $BASE_STAGERUN, if set (an older build's stagerun, e.g. before a kernel change)
# Each run: STEPS steps (default 40), its median step after the warm-up (stagerun --json).
# Prints one row per case: predicted step, each variant's medians, and measured / predicted.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
STAGEC=$BUILD/tools/stagec
STAGERUN=$BUILD/tools/stagerun
STEPS=${STEPS:-40}
ROUNDS=${ROUNDS:-3}
for tool in "$STAGEC" "$STAGERUN" ${BASE_STAGERUN:+"$BASE_STAGERUN"}; do
  [ -x "$tool" ] || { echo "handoff.sh: $tool not built (ninja -C $BUILD stagec stagerun)" >&2; exit 1; }
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DB=$WORK/profile-cpu-1threads.json
M=$ROOT/samples/models
TRAIN=(--train --loss cross-entropy --optimizer adam)

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $STEPS steps per run, $ROUNDS rounds"
plan_case() {
  local name=$1; shift
  "$STAGEC" --devices 2 --batch 8 --microbatches 4 "$@" --profile cpu --profile-db "$DB" \
    -o "$WORK/$name" >/dev/null
}
plan_case gpt_tiny_inference "$M/gpt_tiny.onnx" --dim seq=16
plan_case gpt_tiny_1f1b_training "$M/gpt_tiny.onnx" --dim seq=16 "${TRAIN[@]}" --schedule 1f1b
plan_case resnet_small_inference "$M/resnet_small.onnx"
plan_case resnet_small_training "$M/resnet_small.onnx" "${TRAIN[@]}"
plan_case mnist_cnn_training "$M/mnist_cnn.onnx" "${TRAIN[@]}"
CASES=(gpt_tiny_inference gpt_tiny_1f1b_training resnet_small_inference resnet_small_training
       mnist_cnn_training)
VARIANTS=(sleep spin)
[ -n "${BASE_STAGERUN:-}" ] && VARIANTS+=(base)

for round in $(seq "$ROUNDS"); do
  for name in "${CASES[@]}"; do
    for variant in "${VARIANTS[@]}"; do
      case $variant in
        sleep) cmd=("$STAGERUN") ;;
        spin) cmd=("$STAGERUN" --spin-us "${SPIN_US:-200}") ;;
        base) cmd=("$BASE_STAGERUN") ;;
      esac
      "${cmd[@]}" "$WORK/$name" --steps "$STEPS" --threads-per-device 1 --json -q | tail -n 1 \
        >"$WORK/$name.$variant.$round.json"
    done
  done
done

python3 - "$WORK" "$ROUNDS" "${VARIANTS[@]}" -- "${CASES[@]}" <<'PY'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
split = sys.argv.index("--")
variants, cases = sys.argv[3:split], sys.argv[split + 1:]
head = " | ".join(f"{v}: median step, each run (ms) | {v} / predicted" for v in variants)
print(f"| case | predicted | {head} |")
print("|---|---|" + "---|---|" * len(variants))
for name in cases:
    cells = []
    predicted = None
    for v in variants:
        runs = [json.load(open(f"{work}/{name}.{v}.{r}.json")) for r in range(1, rounds + 1)]
        predicted = runs[0]["predicted_step_ms"]
        steps = sorted(r["median_step_ms"] for r in runs)
        mid = steps[len(steps) // 2]
        cells.append(" / ".join(f"{s:.3f}" for s in (r["median_step_ms"] for r in runs)))
        cells.append(f"{mid / predicted:.2f}x")
    print(f"| {name} | {predicted:.3f} | " + " | ".join(cells) + " |")
PY
