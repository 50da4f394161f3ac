#!/usr/bin/env bash
# What a GPU machine needs to test and measure stagecraft without installing anything (it has
# no package registry): a Release build made here, stripped, with the shared libraries it needs
# that are neither the C runtime's nor CUDA's (those the GPU machine has), ONNX's conformance
# data, the samples and tools/gpu/run.sh, packed as .gpu/bundle.tar.xz (git-ignored).
#
#   bash tools/gpu/bundle.sh            # then, on the GPU machine: bash tools/gpu/run.sh
#
# With the device tool: carry [".gpu"] and run `bash tools/gpu/run.sh`; results land in $OUT.
# Build folder: $STAGECRAFT_GPU_BUILD (default build-gpu), built as $STAGECRAFT_GPU_BUILD_TYPE
# (default Release; RelWithDebInfo reuses a developer's build folder, whose binaries are stripped
# here all the same). Needs what tools/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
build=${STAGECRAFT_GPU_BUILD:-build-gpu}
targets="stagec stagerun stagedump stagecraft-make-samples stagecraft-lm-data stagecraft_cuda stagecraft-gpu-probe
  stagecraft_grad_tests stagecraft-conformance stagecraft_gpu_pipeline_tests
  stagecraft_gpu_attention_tests stagecraft_gpu_gelu_tests"

build_type=${STAGECRAFT_GPU_BUILD_TYPE:-Release}
echo "bundle: building ($build_type) in $build"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${launcher[@]}" >/dev/null
# shellcheck disable=SC2086
ninja -C "$build" $targets

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/stagecraft
mkdir -p "$b/bin" "$b/lib" "$b/data" "$b/samples"
# The build's own binary, never the install test's copy under tests/install (an older build's).
find_target() {
  find "$build" -path "$build/tests/install" -prune -o -name "$1" -type f -perm -u+x -print | head -1
}
for t in stagec stagerun stagedump stagecraft-make-samples stagecraft-lm-data stagecraft-gpu-probe \
         stagecraft_grad_tests stagecraft-conformance stagecraft_gpu_pipeline_tests \
         stagecraft_gpu_attention_tests stagecraft_gpu_gelu_tests; do
  f=$(find_target "$t")
  [ -n "$f" ] || { echo "bundle: $t was not built" >&2; exit 1; }
  cp "$f" "$b/bin/"
done
cp "$build/runtime/libstagecraft_cuda.so" "$b/lib/"
strip --strip-unneeded "$b"/bin/* "$b"/lib/*.so

# Open MPI (Debian 12's 4.1 and its PMIx) for the GPU ranks' check (run.sh's mpi-gpu): the GPU
# machines have none. run.sh relocates it with OPAL_PREFIX and PMIx's component path (checked
# here with Debian's own copy hidden: mpirun -np 2 ran from the bundle's tree alone).
ompi_libs=()
if [ -x /usr/bin/orterun ] && [ -d /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 ]; then
  o=$b/ompi
  mkdir -p "$o/bin" "$o/lib/x86_64-linux-gnu/openmpi/lib" "$o/share"
  cp -L /usr/bin/orterun "$o/bin/mpirun"
  cp -L /usr/bin/orted "$o/bin/"
  cp -a /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 "$o/lib/x86_64-linux-gnu/openmpi/lib/"
  cp -a /usr/lib/x86_64-linux-gnu/openmpi/lib/libmca_common_*.so* \
    "$o/lib/x86_64-linux-gnu/openmpi/lib/"
  cp -r /usr/share/openmpi "$o/share/"
  cp -a /usr/lib/x86_64-linux-gnu/pmix2 "$o/pmix2"
  rm -rf "$o/pmix2/include" "$o/pmix2/lib/libpmix.a"
  ompi_libs=("$o"/bin/* "$o"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so "$o"/pmix2/lib/pmix/*.so)
else
  echo "bundle: no Debian Open MPI here (openmpi-bin): the bundle has no mpirun" >&2
fi

# Shared libraries: everything the binaries and the plugin load, except the C runtime (the GPU
# machine's own, newer) and CUDA's (the GPU machine's, matching its driver).
skip='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|/libgcc_s|/libstdc\+\+|libcuda\.so|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink'
for f in "$b"/bin/* "$b"/lib/libstagecraft_cuda.so "${ompi_libs[@]}"; do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev "$skip" | while read -r lib; do
  cp -L "$lib" "$b/lib/"
done
strip --strip-unneeded "$b"/lib/*.so* 2>/dev/null || true

testdata=/usr/share/libonnx-testdata/data
[ -d "$testdata" ] || { echo "bundle: $testdata is missing (tools/setup.sh installs libonnx-testdata)" >&2; exit 1; }
cp -r "$testdata" "$b/data/onnx"
cp samples/models/*.onnx "$b/samples/"
[ -d samples/models/gpt_tiny_external ] && cp -r samples/models/gpt_tiny_external "$b/samples/"
cp tests/conformance/skips.txt "$b/"
cp tests/mpi/mpi_test.sh "$b/"  # its gpu_train check (run.sh: mpi-gpu)
git -C "$root" rev-parse --short HEAD > "$b/COMMIT" 2>/dev/null || echo unknown > "$b/COMMIT"

mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz stagecraft
size=$(stat -c %s .gpu/bundle.tar.xz)
echo "bundle: .gpu/bundle.tar.xz, $((size / 1024 / 1024)) MiB ($(ls "$b/lib" | wc -l) libraries, commit $(cat "$b/COMMIT"))"
if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
  echo "bundle: larger than the device tool's 64 MiB working-tree limit allows" >&2
  exit 1
fi
