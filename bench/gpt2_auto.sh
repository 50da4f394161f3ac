#!/usr/bin/env bash
# GPT-2 small (12 layers, width 768, 12 heads, seq 1024, vocab 50257) training, mixed AdamW,
# global batch 64, h100 spec: stagec --auto on 8 and 16 devices against the best hand-picked
# 1F1B configuration (every microbatch count 1..64 and data-parallel degree the devices allow,
# recompute none and auto), all dry runs. Usage: bash bench/gpt2_auto.sh (after tools/build.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=$ROOT/build/tools
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
"$ROOT/build/samples/stagecraft-make-samples" gpt -o "$W/gpt2.onnx" --layers 12 --width 768 \
  --heads 12 --seq 1024 --vocab 50257 --no-weight-bytes > /dev/null
common=(--dry-run --train --batch 64 --dim seq=1024 --precision mixed --optimizer adamw --device-spec h100)
for devices in 8 16; do
  echo "== $devices devices"
  /usr/bin/time -f "--auto: %e s wall, %M KiB" "$S/stagec" "$W/gpt2.onnx" --devices "$devices" "${common[@]}" \
    --auto > "$W/auto.txt" 2> "$W/auto.err" || true
  grep -E "^--auto: chose" "$W/auto.txt" | cut -c1-260 || true
  tail -1 "$W/auto.err"
  best=""; best_ms=""
  for r in 1 2 4 8 16; do
    [ $((devices % r)) -eq 0 ] && [ $((devices / r)) -ge 1 ] || continue
    for m in 1 2 4 8 16 32 64; do
      [ $((64 % (m * r))) -eq 0 ] || continue
      for rc in none auto; do
        out=$("$S/stagec" "$W/gpt2.onnx" --devices "$devices" "${common[@]}" --schedule 1f1b \
          --microbatches "$m" --data-parallel "$r" --recompute "$rc" 2>&1 | grep -E "^  predicted:" || true)
        [ -n "$out" ] || continue
        ms=$(echo "$out" | sed -n 's/.*step \([0-9.]*\) ms.*/\1/p')
        if [ -z "$best_ms" ] || awk -v a="$ms" -v b="$best_ms" 'BEGIN{exit !(a < b)}'; then
          best_ms=$ms; best="1f1b, $m microbatches, $r replicas, recompute $rc:$(echo "$out" | sed 's/^  predicted: *//')"
        fi
      done
    done
  done
  echo "best hand-picked 1F1B: $best"
done
