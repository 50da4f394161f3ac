#!/usr/bin/env bash
# The data reader's overlap (issue 35): one gpt_tiny training plan (batch 16, seq 64, 2 devices,
# 1F1B, 4 microbatches, the CPU) fed three ways, each `stagerun --steps STEPS --json` (median
# step, the warm-up step left out), ROUNDS rounds in turn:
#   synthetic: --synthetic, inputs made once in memory;
#   data:      --data DIR, whole batches of input_ids and labels (stagecraft-lm-data --out) read
#              into memory before the run;
#   tokens:    --tokens FILE --shuffle, the same text as a token stream read window by window
#              while the steps run (the background reader, bounded).
# If the reader's work hides behind the steps, the three medians agree within the run-to-run
# spread. Usage: bash bench/token_reader.sh [STEPS] [ROUNDS]   (after tools/build.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=$ROOT/build/tools
steps=${1:-60}
rounds=${2:-3}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%H:%MZ)"
# The text: the project's own docs, repeated to about 4 MB (4 M byte tokens).
for _ in $(seq 40); do cat "$ROOT"/README.md "$ROOT"/docs/*.md; done > text.txt
"$S/stagecraft-lm-data" --tokens-out tokens.bin --text text.txt > /dev/null
"$S/stagecraft-lm-data" --out data --text text.txt --batches 8 --batch 16 --seq 64 > /dev/null
echo "text: $(stat -c %s text.txt) bytes; tokens.bin $(stat -c %s tokens.bin) bytes"
"$S/stagec" "$ROOT/samples/models/gpt_tiny.onnx" -o plan --devices 2 --train --schedule 1f1b \
  --microbatches 4 --batch 16 --dim seq=64 --loss cross-entropy --device-spec cpu > plan.txt
median() { grep '"type":"summary"' "$1" | grep -o '"median_step_ms":[0-9.]*' | cut -d: -f2; }
for round in $(seq "$rounds"); do
  for feed in synthetic data tokens; do
    case $feed in
      synthetic) args=(--synthetic) ;;
      data) args=(--data data) ;;
      tokens) args=(--tokens tokens.bin --shuffle --seed 1) ;;
    esac
    "$S/stagerun" plan --steps "$steps" --threads-per-device 1 --json -q "${args[@]}" > "$feed.json"
    printf 'round %s %-9s median step %s ms\n' "$round" "$feed" "$(median "$feed.json")"
  done
done
