#!/usr/bin/env bash
# Fuzzes every reader of tests/fuzz with clang's libFuzzer (ASan + UBSan) for SECONDS each
# (default 60), one target after another, in build-fuzz/. New inputs grow in
# build-fuzz/tests/fuzz/grown/TARGET; crashes, hangs (10 s) and sanitizer reports are written to
# build-fuzz/tests/fuzz/findings/TARGET (copy each into tests/fuzz/corpus/TARGET once fixed).
# Prints each target's executions and coverage. FUZZ_JOBS=N (default 1) fuzzes N targets at
# once, for a machine with cores to spare; each target still gets SECONDS of wall time.
#   [FUZZ_JOBS=N] bash tools/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(model_import tensor_file specs plan checkpoint torch_csv token_stream)
bash tools/setup.sh
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "fuzz.sh: installing clang and libFuzzer (Debian: clang libclang-rt-14-dev)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev >/dev/null
fi
jobs=$(nproc 2>/dev/null || echo 2)
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTAGECRAFT_FUZZ=ON -DSTAGECRAFT_FUZZ_SECONDS="$seconds" -DSTAGECRAFT_CUDA=OFF >/dev/null
build_targets=(stagec stagerun stagecraft-fuzz-seeds)
for t in "${targets[@]}"; do build_targets+=("stagecraft-fuzz-$t"); done
cmake --build build-fuzz -j "$jobs" --target "${build_targets[@]}"
cd build-fuzz
ctest -R '^fuzz\.templates$' --output-on-failure >/dev/null
fuzz_jobs=${FUZZ_JOBS:-1}
[[ "$fuzz_jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: FUZZ_JOBS must be a positive integer, got '$fuzz_jobs'" >&2; exit 2; }
echo "fuzz.sh: $seconds s per target, $fuzz_jobs at a time; logs in build-fuzz/fuzz-TARGET.log"
fuzz_one() {
  local t=$1 status=0
  # The templates were made once above: running that fixture again beside another target races.
  ctest -R "^fuzz\\.run\\.$t\$" -FA fuzz_templates -V >"fuzz-$t.log" 2>&1 || status=1
  local runs cov findings
  runs=$(grep -ao "stat::number_of_executed_units: [0-9]*" "fuzz-$t.log" | tail -1 | awk '{print $2}')
  cov=$(grep -aoE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+" "fuzz-$t.log" | tail -1)
  findings=$(find "tests/fuzz/findings/$t" -type f 2>/dev/null | wc -l)
  echo "  $t: ${runs:-?} executions, ${cov:-no coverage line}, findings: $findings"
  return $status
}
rc=0
pids=()
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$fuzz_jobs" ]; do wait -n || rc=1; done
  fuzz_one "$t" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
