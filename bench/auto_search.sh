#!/usr/bin/env bash
# stagec --auto's planning time (issue 34, item 2): on the bundled samples, and on the
# GPT-3-175B-shaped decoder of bench/dry_run_175b.sh (64 devices, batch 64, mixed precision;
# training with AdamW, 1f1b and recompute auto held, and inference with everything searched).
# Usage: bash bench/auto_search.sh [samples|175b|all]   (after tools/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
timed() {  # timed LABEL COMMAND...: wall time and peak RSS, then the choice and the counts
  echo "== $1"
  shift
  /usr/bin/time -f "%e s wall, %M KiB peak RSS" "$@" > "$dir/out.txt" 2> "$dir/err.txt" || true
  grep -E "^--auto: |error" "$dir/out.txt" "$dir/err.txt" | sed 's/^[^:]*txt://' || true
  tail -1 "$dir/err.txt"
}
stagec=build/tools/stagec
m=samples/models
if [ "$what" = samples ] || [ "$what" = all ]; then
  timed "gpt_tiny, training, 4 devices, batch 16" $stagec $m/gpt_tiny.onnx --dry-run --devices 4 \
    --train --loss cross-entropy --batch 16 --dim seq=32 --device-spec cpu --auto
  timed "mnist_cnn, training, 4 devices, batch 16" $stagec $m/mnist_cnn.onnx --dry-run --devices 4 \
    --train --loss cross-entropy --batch 16 --device-spec cpu --auto
  timed "resnet_small, inference, 4 devices, batch 16" $stagec $m/resnet_small.onnx --dry-run \
    --devices 4 --batch 16 --device-spec cpu --auto
fi
if [ "$what" = 175b ] || [ "$what" = all ]; then
  build/samples/stagecraft-make-samples gpt -o "$dir/model.onnx" --layers 96 --width 12288 \
    --heads 96 --seq 2048 --vocab 50257 --no-weight-bytes > /dev/null
  common=(--dry-run --devices 64 --train --batch 64 --dim seq=2048 --precision mixed
          --optimizer adamw --device-spec h100)
  timed "175B, training, 1f1b held, recompute auto held" $stagec "$dir/model.onnx" "${common[@]}" \
    --schedule 1f1b --recompute auto --auto
  timed "175B, inference, everything searched" $stagec "$dir/model.onnx" --dry-run --devices 64 \
    --batch 64 --dim seq=2048 --precision mixed --device-spec h100 --auto
fi
