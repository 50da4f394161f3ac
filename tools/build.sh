#!/usr/bin/env bash
# Sets up (Debian packages) and builds stagecraft into build/. Used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTAGECRAFT_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
