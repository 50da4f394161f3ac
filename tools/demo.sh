#!/usr/bin/env bash
# Quick start, first command: set up, build, and run the main job on a bundled sample:
# look at the model, compile it into a 2-device pipelined plan, inspect the plan, and run it
# on the CPU backend (one thread per device), comparing measured with predicted figures; then
# compile and run a 2-device training plan of the same model (loss per step).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
model=samples/models/gpt_tiny.onnx
run() { echo; echo "== $*"; "$@"; }
run build/tools/stagec "$model" --info --batch 8 --dim seq=32
run build/tools/stagec "$model" -o build/demo_plan --devices 2 --batch 8 --microbatches 4 \
  --dim seq=32 --device-spec cpu
run build/tools/stagedump build/demo_plan
run build/tools/stagerun build/demo_plan --steps 20 --outputs build/demo_outputs --trace build/demo_trace.json
# Training: the same model with a cross-entropy loss appended, 1F1B on 2 devices, Adam.
run build/tools/stagec "$model" -o build/demo_train_plan --devices 2 --train --loss cross-entropy \
  --optimizer adam --lr 0.01 --batch 8 --microbatches 4 --dim seq=32 --device-spec cpu
run build/tools/stagerun build/demo_train_plan --steps 10
