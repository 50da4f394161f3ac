#!/usr/bin/env bash
# Dry-run planning of a GPT-3-175B-shaped decoder (96 layers, width 12288, 96 heads,
# sequence 2048, vocabulary 50257) for 64 devices. The model is written by the project's own
# builder with a sparse weight file (no weight bytes on disk); stagec reads no weight bytes.
# Usage: bash bench/dry_run_175b.sh [RUNS]   (after tools/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
build/samples/stagecraft-make-samples gpt -o "$dir/model.onnx" --layers 96 --width 12288 --heads 96 \
  --seq 2048 --vocab 50257 --no-weight-bytes
# Training: mixed-precision AdamW, 1F1B, 2 microbatches (more do not fit in 80 GB per device
# without recomputation: stagec refuses them and says which stage needs how much).
echo "== training, 1f1b, 64 devices, 2 microbatches"
for i in $(seq "$runs"); do
  /usr/bin/time -f "run $i: %e s wall, %M KiB peak RSS" \
    build/tools/stagec "$dir/model.onnx" --dry-run --devices 64 --train --schedule 1f1b \
    --batch 2 --microbatches 2 --dim seq=2048 --precision mixed --optimizer adamw --device-spec h100 \
    > "$dir/train.txt" 2>&1 || true
done
grep -E "stages on|predicted:|parameter-balanced:|op-count-balanced:|split search:|planned in|error" "$dir/train.txt" || true
echo "== inference, 64 devices, 64 microbatches"
for i in $(seq "$runs"); do
  /usr/bin/time -f "run $i: %e s wall, %M KiB peak RSS" \
    build/tools/stagec "$dir/model.onnx" --dry-run --devices 64 --batch 64 --microbatches 64 \
    --dim seq=2048 --precision mixed --device-spec h100 > "$dir/infer.txt"
done
grep -E "stages on|predicted:|parameter-balanced:|op-count-balanced:|split search:|planned in" "$dir/infer.txt"
# Training with 64 microbatches, which needs recomputation: 1F1B, and the interleaved schedule
# (2 chunks per device, checked together against the whole device).
for schedule in 1f1b "interleaved --chunks 2"; do
  echo "== training, $schedule, 64 devices, 64 microbatches, --recompute auto"
  for i in $(seq "$runs"); do
    # shellcheck disable=SC2086  # the schedule's words are separate flags
    /usr/bin/time -f "run $i: %e s wall, %M KiB peak RSS" \
      build/tools/stagec "$dir/model.onnx" --dry-run --devices 64 --train --schedule $schedule \
      --batch 64 --microbatches 64 --dim seq=2048 --precision mixed --optimizer adamw \
      --device-spec h100 --recompute auto > "$dir/train64.txt" || true
  done
  grep -E "stages on|predicted:|parameter-balanced:|op-count-balanced:|split search:|planned in" \
    "$dir/train64.txt" || true
done
