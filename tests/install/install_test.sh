#!/usr/bin/env bash
# Installs BUILD into a fresh prefix (`cmake --install`), then uses only the prefix: the tools
# and their man pages are there, the installed stagec plans a sample, a small consumer project
# configured with find_package(stagecraft) builds against stagecraft::runtime and runs the plan,
# and its outputs equal the installed stagerun's byte for byte.
#   install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 source=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for tool in stagec stagedump stagerun stagecraft-lm-data; do
  [ -x "$prefix/bin/$tool" ] || { echo "install_test: $prefix/bin/$tool is missing" >&2; exit 1; }
  "$prefix/bin/$tool" --version | grep -q "^$tool " ||
    { echo "install_test: $tool --version does not name it" >&2; exit 1; }
  if [ "${STAGECRAFT_EXPECT_MAN:-1}" = 1 ]; then
    page=$prefix/share/man/man1/$tool.1
    grep -q '^\.TH' "$page" || { echo "install_test: $page is not a man page" >&2; exit 1; }
  fi
done
[ -f "$prefix/lib/cmake/stagecraft/stagecraftConfig.cmake" ] ||
  { echo "install_test: no CMake package in $prefix/lib/cmake/stagecraft" >&2; exit 1; }
[ -f "$prefix/include/stagecraft/runtime/exec/pipeline.h" ] ||
  { echo "install_test: no runtime headers in $prefix/include/stagecraft" >&2; exit 1; }

"$prefix/bin/stagec" "$source/samples/models/mnist_cnn.onnx" -o "$work/plan" --devices 2 --batch 8 \
  --microbatches 4 --device-spec cpu >/dev/null
"$prefix/bin/stagerun" "$work/plan" --outputs "$work/stagerun_out" -q >/dev/null

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$source/tests/install/consumer" -B "$work/consumer" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$work/consumer_configure.log" ||
  { cat "$work/consumer_configure.log" >&2; exit 1; }
cmake --build "$work/consumer" >"$work/consumer_build.log" 2>&1 ||
  { tail -30 "$work/consumer_build.log" >&2; exit 1; }
"$work/consumer/run_plan" "$work/plan" "$work/consumer_out"
count=0
for f in "$work/stagerun_out"/*.npy; do
  cmp "$f" "$work/consumer_out/$(basename "$f")" ||
    { echo "install_test: $(basename "$f") differs between stagerun and the consumer" >&2; exit 1; }
  count=$((count + 1))
done
[ "$count" -gt 0 ] || { echo "install_test: stagerun wrote no outputs" >&2; exit 1; }
echo "install_test: $count outputs equal; prefix $prefix"
