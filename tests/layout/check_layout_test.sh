#!/usr/bin/env bash
# Proves tools/check_layout.sh can fail: a small tree breaking each rule once is refused with
# one line per offence, and the same tree mended passes.
set -euo pipefail
checker=$1
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/runtime/core" "$tree/runtime/ops" "$tree/runtime/cuda" "$tree/runtime/cpu" \
  "$tree/compiler" "$tree/passes"

# A runtime file that includes a compiler header, and a function of 151 lines.
{
  echo '#include "compiler/schedule/simulator.h"'
  echo 'int long_function() {'
  for i in $(seq 1 149); do echo "  int v$i = $i;"; done
  echo '}'
} >"$tree/runtime/core/bad.cpp"
# Op rules that include a backend, a CUDA file and a pass that include the CPU backend.
echo '#include "runtime/cuda/cuda_context.h"' >"$tree/runtime/ops/bad_rule.h"
echo '#include "runtime/cpu/families.h"' >"$tree/runtime/cuda/bad_kernel.cpp"
echo '#include "runtime/cpu/window.h"' >"$tree/passes/bad_pass.cpp"
# Two enums of one concept, and the core including the executor.
echo 'enum class Mode { kFast, kSmall };' >"$tree/compiler/mode.h"
echo 'enum class Goal : int { kFast, kSmall = 1 };  // the same list' >"$tree/passes/goal.h"
echo '#include "runtime/exec/pipeline.h"' >"$tree/runtime/core/uses_exec.cpp"
# Families: the CUDA pool table outside pool.cpp (and named otherwise), Softmax filed under norm
# on the CPU only, and a CPU family table the list does not name.
table() {  # table FAMILY OP...
  local name=$1
  shift
  echo 'const KernelEntry kKernels[] = {'
  for op in "$@"; do echo "    {\"$op\", run, same_as_cpu},"; done
  echo '};'
  echo "std::span<const KernelEntry> ${name}_kernels() { return kKernels; }"
}
printf 'STAGECRAFT_FAMILY(norm)\nSTAGECRAFT_FAMILY(pool)\n' >"$tree/runtime/ops/families.def"
table norm BatchNormalization Softmax >"$tree/runtime/cpu/norm.cpp"
table norm BatchNormalization >"$tree/runtime/cuda/norm.cpp"
table pool MaxPool >"$tree/runtime/cpu/pool.cpp"
table pooling MaxPool >"$tree/runtime/cuda/pooling.cpp"
table extra Relu >"$tree/runtime/cpu/extra.cpp"
# A file of 801 lines.
for i in $(seq 1 801); do echo "// line $i"; done >"$tree/compiler/big.h"

set +e
out=$(bash "$checker" all "$tree" 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: expected exit 1, got $rc"; exit 1; }
grep -q 'compiler/big.h has 801 lines' <<<"$out" || { echo "FAIL: big file not reported"; exit 1; }
grep -q 'long_function has 151 lines' <<<"$out" || { echo "FAIL: long function not reported"; exit 1; }
grep -q 'runtime/core/bad.cpp:1:#include "compiler/schedule/simulator.h"' <<<"$out" ||
  { echo "FAIL: compiler include not reported"; exit 1; }
grep -q 'runtime/ops/bad_rule.h:1:#include "runtime/cuda/cuda_context.h"' <<<"$out" ||
  { echo "FAIL: a backend include in runtime/ops not reported"; exit 1; }
grep -q 'runtime/cuda/bad_kernel.cpp:1:#include "runtime/cpu/families.h"' <<<"$out" ||
  { echo "FAIL: a CPU include in runtime/cuda not reported"; exit 1; }
grep -q 'passes/bad_pass.cpp:1:#include "runtime/cpu/window.h"' <<<"$out" ||
  { echo "FAIL: a CPU include in passes not reported"; exit 1; }
grep -q 'enums: .*compiler/mode.h: Mode and .*passes/goal.h: Goal list the same enumerators (kFast, kSmall)' <<<"$out" ||
  { echo "FAIL: two enums with one list not reported"; exit 1; }
grep -q 'runtime/core/uses_exec.cpp:1:#include "runtime/exec/pipeline.h"' <<<"$out" ||
  { echo "FAIL: the core including the executor not reported"; exit 1; }

grep -q 'families: pool_kernels() is not defined in runtime/cuda/pool.cpp' <<<"$out" ||
  { echo "FAIL: a family table outside its file not reported"; exit 1; }
grep -q 'families: runtime/cuda/pooling.cpp defines pooling_kernels(), which runtime/ops/families.def does not list' <<<"$out" ||
  { echo "FAIL: a table of a family not listed not reported"; exit 1; }
grep -q 'families: runtime/cpu/extra.cpp defines extra_kernels()' <<<"$out" ||
  { echo "FAIL: a second table not reported"; exit 1; }
grep -q 'families: Softmax is in runtime/cpu/norm.cpp and not in runtime/cuda/norm.cpp' <<<"$out" ||
  { echo "FAIL: an op filed under different families not reported"; exit 1; }

# Mended: 800 lines, 150-line function, no compiler include, op rules and backends apart.
sed -i '1d;3d' "$tree/runtime/core/bad.cpp"
echo '#include "runtime/core/kernel.h"' >"$tree/runtime/ops/bad_rule.h"
echo '#include "runtime/ops/window.h"' >"$tree/runtime/cuda/bad_kernel.cpp"
echo '#include "runtime/ops/window.h"' >"$tree/passes/bad_pass.cpp"
sed -i '1d' "$tree/compiler/big.h"
echo 'enum class Goal { kQuick, kLean };' >"$tree/passes/goal.h"
echo '#include "runtime/core/kernel.h"' >"$tree/runtime/core/uses_exec.cpp"
mv "$tree/runtime/cuda/pooling.cpp" "$tree/runtime/cuda/pool.cpp"
table pool MaxPool >"$tree/runtime/cuda/pool.cpp"
table norm BatchNormalization Softmax >"$tree/runtime/cuda/norm.cpp"
rm "$tree/runtime/cpu/extra.cpp"
bash "$checker" all "$tree"
echo "check_layout self-test passed"
