#!/usr/bin/env bash
# Quick start, second command: set up, build, and run the whole test suite (ctest).
# Extra arguments go to ctest, e.g. `bash tools/test.sh -L unit` or `-LE slow`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
cd build
ctest --output-on-failure -j "$jobs" "$@"
