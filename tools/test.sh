#!/usr/bin/env bash
# Quick start, second command: set up, build, and run the whole test suite (ctest).
# Extra arguments go to ctest, e.g. `bash tools/test.sh -L unit` or `-LE slow`; the soak check
# (label soak) runs only when they name it: `bash tools/test.sh -L soak`.
#
#   bash tools/test.sh --sanitize address   ASan + UBSan build (build-asan/), whole suite but GPU
#                                           and soak
#   bash tools/test.sh --sanitize thread    TSan build (build-tsan/): the executor, transports,
#                                           training and command-line tests
# A sanitizer report fails the test that caused it (the runtimes abort on the first one).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
bash tools/setup.sh --test   # what only the tests need (Chromium), beside the build's packages

if [ "${1:-}" = "--sanitize" ]; then
  kind=${2:-}
  shift 2 || true
  case "$kind" in
    address) dir=build-asan; labels=(-LE "gpu|soak") ;;
    thread) dir=build-tsan; labels=(-L "runtime|optim|grad|cli") ;;
    *) echo "test.sh: usage error: --sanitize takes address or thread, not '$kind'" >&2; exit 2 ;;
  esac
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTAGECRAFT_WERROR=ON \
    -DSTAGECRAFT_SANITIZE="$kind" >/dev/null
  cmake --build "$dir" -j "$jobs"
  export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # TSan cannot see GCC's OpenMP runtime hand a parallel region to its workers (libgomp is not
  # instrumented), so OpenMP teams have one thread here: the races TSan can judge, between our
  # own threads (device workers, channels, transports), stay checked. What uninstrumented
  # libraries still do inside (oneDNN's primitive cache) is suppressed, nothing else:
  # tools/tsan.supp says why.
  if [ "$kind" = thread ]; then export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}; fi
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1:suppressions=$(pwd)/tools/tsan.supp}
  cd "$dir"
  ctest --output-on-failure -j "$jobs" "${labels[@]}" "$@"
  exit
fi

bash tools/build.sh
cd build
# The soak check (label soak: 20,000 training steps, minutes) runs only when asked for by label
# (`bash tools/test.sh -L soak`), as the GPU checks run only where there is a GPU.
case " $* " in
  *soak*) ctest --output-on-failure -j "$jobs" "$@" ;;
  *) ctest --output-on-failure -j "$jobs" -LE soak "$@" ;;
esac
