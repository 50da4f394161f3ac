#!/usr/bin/env bash
# Installs every Debian package stagecraft needs to build, test and run.
# Idempotent: when everything is already installed it only checks and returns.
#   bash tools/setup.sh          to build and run (tools/build.sh, demo.sh)
#   bash tools/setup.sh --test   and to run the whole test suite (tools/test.sh): adds what only
#                                tests use (Chromium for the `browser` label's headless checks)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libonnx-dev libprotobuf-dev protobuf-compiler
  libboost-graph-dev libfmt-dev doctest-dev nlohmann-json3-dev libcli11-dev
  libdnnl-dev ocl-icd-opencl-dev   # dnnl-config.cmake looks for OpenCL (only a Recommends of libdnnl-dev)
  libonnx-testdata
  universal-ctags   # tools/check_layout.sh: function lengths
  openmpi-bin libopenmpi-dev   # mpirun stagerun: one process per plan device (runtime/mpi)
  help2man dpkg-dev   # cmake --install's man pages; cpack -G DEB (dpkg-shlibdeps)
)
if [ "${1:-}" = "--test" ]; then
  # tests/cli/browser_test.sh: stagedump's HTML page in headless Chromium (about 100 MB with its
  # libraries; without recommends, below). tests/cli/views_test.cpp: Graphviz parses
  # stagedump --dot (9 MB).
  PACKAGES+=(chromium graphviz)
elif [ -n "${1:-}" ]; then
  echo "setup: usage error: the only option is --test, not '$1'" >&2
  exit 2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
