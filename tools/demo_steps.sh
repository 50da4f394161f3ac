#!/usr/bin/env bash
# The main job on a bundled sample, run on an already built tree: look at the model, compile
# it into a 2-device pipelined plan, inspect the plan, and run it on the CPU backend (one
# thread per device), comparing measured with predicted figures; then train the same model on
# 2 devices as a language model on next-token labels (loss per step).
#
#   bash tools/demo_steps.sh [BUILD_DIR] [OUT_DIR]    (defaults: build, BUILD_DIR)
#
# tools/demo.sh (Quick start 1) runs it after setting up and building; the ctest `demo`
# (label demo) runs it on the test build, so a broken demo fails CI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$build}
mkdir -p "$out"
model=$root/samples/models/gpt_tiny.onnx
tools=$build/tools
run() { echo; echo "== $*"; "$@"; }
run "$tools/stagec" "$model" --info --batch 8 --dim seq=32
# Costed from this machine's own kernel times (--profile cpu: each op signature timed once,
# cached in the database for the next plan), so the prediction is for the CPU it runs on.
run "$tools/stagec" "$model" -o "$out/demo_plan" --devices 2 --batch 8 --microbatches 4 \
  --dim seq=32 --profile cpu --profile-db "$out/demo_profile.json"
run "$tools/stagedump" "$out/demo_plan"
run "$tools/stagerun" "$out/demo_plan" --steps 20 --outputs "$out/demo_outputs" \
  --trace "$out/demo_trace.json"
# Training: the same model as a byte-level language model on this repository's README: a
# cross-entropy over the vocabulary (logits [B,T,256], token labels [B,T]: the input shifted by
# one, the last position of each row -100, left out) appended, 1F1B on 2 devices, Adam; 10
# batches of next-token data, one per step.
run "$tools/stagecraft-lm-data" --out "$out/demo_data" --text "$root/README.md" --batches 10 \
  --batch 8 --seq 32
run "$tools/stagec" "$model" -o "$out/demo_train_plan" --devices 2 --train --loss cross-entropy \
  --optimizer adam --lr 0.01 --batch 8 --microbatches 4 --dim seq=32 --profile cpu \
  --profile-db "$out/demo_profile.json"
run "$tools/stagerun" "$out/demo_train_plan" --steps 10 --data "$out/demo_data"
