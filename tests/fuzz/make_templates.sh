#!/usr/bin/env bash
# The fuzz targets' templates and generated seeds (tests/fuzz): a small training plan of two
# devices, a checkpoint saved from it after one step, and stagecraft-fuzz-seeds' inputs.
#   make_templates.sh STAGEC STAGERUN SEEDS_TOOL MODEL OUT
set -euo pipefail
stagec=$1 stagerun=$2 seeds=$3 model=$4 out=$5
rm -rf "$out/plan" "$out/checkpoint" "$out/seeds"
mkdir -p "$out"
"$stagec" "$model" -o "$out/plan" --devices 2 --train --loss mse --batch 8 --microbatches 2 \
  --device-spec cpu >/dev/null
"$stagerun" "$out/plan" --backend cpu --steps 1 --synthetic --quiet \
  --checkpoint "$out/checkpoint" >/dev/null
"$seeds" "$out/seeds" "$out/plan" "$out/checkpoint"
# The schedule CSV target's seeds are checked in (tests/fuzz/corpus/torch_csv).
mkdir -p "$out/seeds/torch_csv"
echo "fuzz templates: $out/plan, $out/checkpoint, seeds in $out/seeds"
