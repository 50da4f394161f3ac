#!/usr/bin/env bash
# Mixed precision on the CPU: the training step of a bf16 plan (stagec --precision mixed)
# against the fp32 plan of the same model, one device, 1 thread. Which of the matmul family's
# bf16 kernels run natively (oneDNN bf16 matmul, float32 accumulation) and which are widened to
# float32 around the call is the binary's: run it with STAGEC/STAGERUN of two builds to compare
# them (bench/RESULTS.md, "Native bf16 Gemm and matmul gradients").
#
# Usage (repo root, after bash tools/build.sh):  bash bench/bf16_matmul.sh
# Environment: BUILD=build, STAGEC=$BUILD/tools/stagec, STAGERUN=$BUILD/tools/stagerun,
#   SEQ=64, BATCH=16, M=2, STEPS=12, REPEAT=3 (runs per plan; the table gives each run's median).
set -euo pipefail
BUILD=${BUILD:-build}
STAGEC=${STAGEC:-$BUILD/tools/stagec}
STAGERUN=${STAGERUN:-$BUILD/tools/stagerun}
SEQ=${SEQ:-64}
BATCH=${BATCH:-16}
M=${M:-2}
STEPS=${STEPS:-12}
REPEAT=${REPEAT:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $STAGERUN"
echo "batch $BATCH in $M microbatches, $STEPS steps, median of the steps after the first"
echo
echo "| model | precision | median step ms (each run) | final loss |"
echo "|---|---|---|---|"
for model in gpt_tiny mnist_cnn; do
  args=(samples/models/$model.onnx --devices 1 --train --loss cross-entropy --optimizer adam
    --batch "$BATCH" --microbatches "$M" --device-spec cpu)
  [ $model = gpt_tiny ] && args+=(--dim seq="$SEQ")
  for precision in fp32 mixed; do
    plan=$work/$model-$precision
    "$STAGEC" "${args[@]}" --precision $precision -o "$plan" >/dev/null
    times=() loss=""
    for _ in $(seq "$REPEAT"); do
      summary=$("$STAGERUN" "$plan" --backend cpu --steps "$STEPS" --json -q | tail -n 1)
      times+=("$(grep -o '"median_step_ms":[0-9.e+-]*' <<<"$summary" | cut -d: -f2)")
      loss=$(grep -o '"final_loss":[0-9.e+-]*' <<<"$summary" | cut -d: -f2)
    done
    printf '| %s | %s | %s | %s |\n' $model $precision \
      "$(printf '%.2f ' "${times[@]}")" "$loss"
  done
done
