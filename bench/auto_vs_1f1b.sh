#!/usr/bin/env bash
# stagec --auto's plan against the default 1F1B plan, measured on the CPU (issue 34): gpt_tiny
# (batch 16, seq 32) and resnet_small (batch 16), training on 2 devices, both planned with
# --profile cpu, each run with stagerun --steps 10 --threads-per-device 1 (median step).
# Usage: bash bench/auto_vs_1f1b.sh   (after tools/build.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=$ROOT/build/tools; M=$ROOT/samples/models
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT; cd "$W"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%H:%MZ)"
run() {  # run NAME MODEL ARGS...
  local name=$1 model=$2; shift 2
  $S/stagec "$model" -o "$name.auto" --devices 2 --train --loss cross-entropy --profile cpu --profile-db db.json "$@" --auto > "$name.auto.txt"
  $S/stagec "$model" -o "$name.1f1b" --devices 2 --train --loss cross-entropy --profile cpu --profile-db db.json "$@" --schedule 1f1b > "$name.1f1b.txt"
  grep "^--auto: chose" "$name.auto.txt" | cut -c1-220
  for p in auto 1f1b; do
    $S/stagerun "$name.$p" --steps 10 --threads-per-device 1 --json -q | tail -1 > "$name.$p.json"
    printf '%s %s: predicted %s ms, measured median %s ms\n' "$name" "$p" \
      "$(grep -o '"predicted_step_ms":[0-9.]*' "$name.$p.json" | cut -d: -f2)" \
      "$(grep -o '"median_step_ms":[0-9.]*' "$name.$p.json" | cut -d: -f2)"
  done
}
run gpt_tiny $M/gpt_tiny.onnx --batch 16 --dim seq=32
run resnet_small $M/resnet_small.onnx --batch 16
