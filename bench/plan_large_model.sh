#!/usr/bin/env bash
# Models bigger than this machine's memory (issue 28). Written by the project's own builder with
# sparse external-data files (no weight bytes on disk; reads return zeros at disk-cache speed).
#  1. An 8-layer, width-8192 GPT (27 GB of float32 weights) planned for 8 devices, training,
#     mixed precision, and written: stagec's wall time and peak resident memory
#     (/usr/bin/time), and the size of the plan directory's own files (the stage files
#     reference the model's data file: nothing is copied).
#  2. A 4-layer, width-4096 GPT (4.9 GB) planned for inference on 4 devices and run once by
#     stagerun on the CPU: each device reads only its stages' windows of the data file; stagerun
#     prints what each read and how long it took, against the model's total.
# Usage: bash bench/plan_large_model.sh   (after tools/build.sh; about 2 minutes, 30 GB sparse)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
make=build/samples/stagecraft-make-samples
echo "== 27 GB: 8 layers, width 8192, training, mixed, 8 devices, written"
$make gpt -o "$dir/big/model.onnx" --layers 8 --width 8192 --heads 64 --seq 1024 --vocab 50257 \
  --no-weight-bytes
/usr/bin/time -f "stagec: %e s wall, %M KiB peak RSS" \
  build/tools/stagec "$dir/big/model.onnx" -o "$dir/big_plan" --devices 8 --train \
  --loss cross-entropy --batch 8 --microbatches 8 --dim seq=1024 --precision mixed \
  --optimizer adamw --device-spec h100 | grep -E "stages on|predicted:|planned in"
echo "plan directory (its own files): $(find "$dir/big_plan" -type f -printf '%s\n' |
  awk '{s += $1} END {printf "%.1f MB", s / 1e6}') in $(find "$dir/big_plan" -type f | wc -l) files"
echo "== 4.9 GB: 4 layers, width 4096, inference, 4 devices, run once"
$make gpt -o "$dir/mid/model.onnx" --layers 4 --width 4096 --heads 32 --seq 64 --vocab 50257 \
  --no-weight-bytes
build/tools/stagec "$dir/mid/model.onnx" -o "$dir/mid_plan" --devices 4 --batch 4 \
  --microbatches 4 --dim seq=64 --device-spec cpu | grep -E "stages on|planned in"
/usr/bin/time -f "stagerun: %e s wall, %M KiB peak RSS" \
  build/tools/stagerun "$dir/mid_plan" --steps 1 --synthetic 2>&1 |
  grep -E "loaded|stagerun:|step"
