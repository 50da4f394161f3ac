#!/usr/bin/env bash
# Quick start, first command: set up, build, and run the main job on a bundled sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
echo
echo "== stagec --info samples/models/gpt_tiny.onnx --batch 8 --dim seq=32"
build/tools/stagec --info samples/models/gpt_tiny.onnx --batch 8 --dim seq=32
