#!/usr/bin/env bash
# On a GPU machine: the GPU checks and measurements of stagecraft from .gpu/bundle.tar.xz
# (tools/gpu/bundle.sh), so the machine's time goes to measuring, not installing. Writes
# $OUT/summary.txt (one line per check: PASS, FAIL or SKIP with its seconds, and the figures)
# and $OUT/log.txt (every command's whole output); OUT defaults to ./gpu-results.
#
#   bash tools/gpu/run.sh [checks|bench|all]    (default all)
#
# checks: the CUDA backend against the CPU backend, every gradient case of the kernel harness
#   (STAGECRAFT_TEST_BACKEND=cuda), ONNX's conformance cases with the CPU's skip list, whole
#   plans (inference outputs and training loss curves, 1, 2 and 4 devices sharing the GPU,
#   every schedule), and compute-sanitizer memcheck and racecheck over a short pipeline run.
# bench: 2- and 4-stage pipelines sharing the GPU, planned from a --profile cuda database:
#   measured step and bubble against the plan's prediction (stagerun --json).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
out=${OUT:-$PWD/gpu-results}
mkdir -p "$out"
summary=$out/summary.txt
log=$out/log.txt
: >"$summary"
: >"$log"
say() { echo "$*" | tee -a "$summary"; }

[ -f .gpu/bundle.tar.xz ] || { say "FAIL no .gpu/bundle.tar.xz: run tools/gpu/bundle.sh first and carry .gpu"; exit 1; }
work=${TMPDIR:-/tmp}/stagecraft-gpu
rm -rf "$work"
mkdir -p "$work"
tar -C "$work" -xJf .gpu/bundle.tar.xz
b=$work/stagecraft
say "stagecraft $(cat "$b/COMMIT") on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"

# CUDA's libraries: the machine's own, wherever they are (toolkit, system, Python wheels).
libdirs=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  f=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
  [ -n "$f" ] || f=$(find /usr/local /usr/lib /opt -name "$lib" 2>/dev/null | head -1)
  if [ -z "$f" ]; then say "FAIL $lib not found on this machine"; continue; fi
  libdirs="$libdirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$b/lib$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export STAGECRAFT_SAMPLES=$b/samples STAGECRAFT_CUDA_PLUGIN=$b/lib/libstagecraft_cuda.so
export PATH="$b/bin:$PATH"

# check NAME TIMEOUT COMMAND...: one summary line (exit 77 is a skip), the output to the log.
check() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*" >>"$log"
  local t0 rc
  t0=$(date +%s.%N)
  timeout "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local s
  s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) say "PASS $name (${s} s)" ;;
    77) say "SKIP $name (${s} s)" ;;
    124) say "FAIL $name: timed out after $limit s" ;;
    *) say "FAIL $name: exit $rc (${s} s; see log.txt)" ;;
  esac
  return $rc
}

if ! check probe 60 stagecraft-gpu-probe; then
  say "no usable GPU: nothing else runs"
  exit 1
fi

if [ "$what" = all ] || [ "$what" = checks ]; then
  STAGECRAFT_TEST_BACKEND=cuda check gradients 900 stagecraft_grad_tests
  check conformance 900 stagecraft-conformance --backend cuda --skips "$b/skips.txt" --data "$b/data/onnx"
  grep -E "^(passed|pass|[0-9]+ pass)" "$log" | tail -1 | sed 's/^/conformance: /' >>"$summary"
  check pipelines 1200 stagecraft_gpu_pipeline_tests
  if command -v compute-sanitizer >/dev/null; then
    check memcheck 900 compute-sanitizer --tool memcheck --error-exitcode 1 \
      stagecraft_gpu_pipeline_tests -tc="inference*"
    check racecheck 900 compute-sanitizer --tool racecheck --error-exitcode 1 \
      stagecraft_gpu_pipeline_tests -tc="inference*"
  else
    say "SKIP memcheck, racecheck: compute-sanitizer is not on this machine"
  fi
fi

if [ "$what" = all ] || [ "$what" = bench ]; then
  p=$work/plans
  mkdir -p "$p"
  for model in gpt_tiny resnet_small; do
    extra=""
    [ $model = gpt_tiny ] && extra="--dim seq=64 --loss cross-entropy" || extra="--loss mse"
    for devices in 2 4; do
      for mode in infer train; do
        plan=$p/$model-$devices-$mode
        flags="--devices $devices --batch 64 --microbatches 8 --profile cuda --profile-db $p/profile-cuda.json"
        [ $mode = train ] && flags="$flags --train $extra --schedule 1f1b"
        [ $mode = infer ] && [ $model = gpt_tiny ] && flags="$flags --dim seq=64"
        # shellcheck disable=SC2086
        check "plan $model $devices $mode" 600 stagec "$b/samples/$model.onnx" -o "$plan" $flags || continue
        if check "run $model $devices $mode" 600 stagerun "$plan" --backend cuda --steps 20 --json -q; then
          # --json: JSON Lines; the summary record is the last line of type "summary".
          grep '"type":"summary"' "$log" | tail -1 |
            grep -oE '"(median_step_ms|predicted_step_ms|bubble)":(\{[^}]*\}|[^,]*)' |
            tr '\n' ' ' | sed "s/^/  $model $devices $mode: /" >>"$summary"
          echo >>"$summary"
        fi
      done
    done
  done
fi
say "done"
