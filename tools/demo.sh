#!/usr/bin/env bash
# Quick start, first command: set up (Debian packages), build, and run the main job on a
# bundled sample (tools/demo_steps.sh: model facts, compile a 2-device pipelined plan,
# inspect it, run it on the CPU backend against the prediction, then train it on 2 devices).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
bash tools/demo_steps.sh build build
