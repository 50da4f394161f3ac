#!/usr/bin/env bash
# On a GPU machine: the GPU checks and measurements of stagecraft from .gpu/bundle.tar.xz
# (tools/gpu/bundle.sh), so the machine's time goes to measuring, not installing. Writes
# $OUT/summary.txt (one line per check: PASS, FAIL or SKIP with its seconds, and the figures)
# and $OUT/log.txt (every command's whole output); OUT defaults to ./gpu-results.
#
#   bash tools/gpu/run.sh [checks] [attention] [racecheck] [mpi-bench] [bench] [profiled] [torch]
#                         [tokens] [attention-step] [kernels] [all]
#   (default all)
#
# A lease is short (the device tool allows 10 minutes a command), so the three checks that share
# no state (gradients, conformance, pipelines) run at once, each with its own log appended to
# log.txt as it ends, and $STAGECRAFT_GPU_DEADLINE (seconds, default 570) bounds the whole
# script: a check or measurement that would start after it is reported as "not run (deadline)".
#
# checks: the CUDA backend against the CPU backend, every gradient case of the kernel harness
#   (STAGECRAFT_TEST_BACKEND=cuda), ONNX's conformance cases with the CPU's skip list, whole
#   plans (inference outputs and training loss curves, 1, 2 and 4 devices sharing the GPU,
#   every schedule), compute-sanitizer memcheck and racecheck over a short pipeline run, and 2
#   GPU ranks under mpirun against one process (mpi-gpu: NCCL, or MPI through host memory where
#   the ranks share a GPU; only where the machine has mpirun).
# attention: the fused attention kernels one version at a time against the CPU backend's
#   (STAGECRAFT_ATTENTION_KERNELS: mma, the default, 16-bit nodes on the tensor cores, skipping
#   the mask rules on unmasked tiles and taking exp2f, not yet checked; mma-ldmatrix, the same
#   reading B fragments by ldmatrix.trans, not yet checked; mma-async, those with the next tile
#   copied by cp.async while the current one is computed on, not yet checked; mma-expf, the tensor-core kernels
#   as checked on 2026-11-30 (the rules and expf on every score); tiled; tensor-core, float32
#   nodes in tf32; plain), then racecheck over all but plain (they share tiles through shared
#   memory), the newest first.
# attention-step: GPT-2 mixed's step (the torch part's plan) with its 16-bit attention on the
#   tiled kernels and on the tensor cores (STAGECRAFT_ATTENTION_KERNELS=tiled, =mma-expf, =mma,
#   =mma-ldmatrix, =mma-async).
# mpi-bench: GPU ranks under mpirun against one process (bench/mpi_ranks.sh, BACKEND=cuda).
# bench: 2- and 4-stage pipelines sharing the GPU, planned from a --profile cuda database:
#   measured step and bubble against the plan's prediction (stagerun --json).
# profiled: a GPT-2-small-shaped training step on 1 and 2 devices sharing the GPU, planned
#   from a --profile cuda database: measured step against the prediction.
# torch: bench/gpu_vs_pytorch.sh: one-GPU training steps of a GPT-2-small-shaped model and of
#   ResNet-50 by stagerun against PyTorch eager and torch.compile on the same GPU.
# tokens: the torch part's GPT-2 mixed plan fed from a token file (--tokens, each step its own
#   run) against --synthetic (one run): on CUDA each run uploads every weight and optimizer
#   state and downloads them at its end (issue 35); needs the torch part first.
# kernels: bench/kernel_profile.sh: the same models' steps per kernel (Nsight Compute for
#   stagerun, torch.profiler for PyTorch eager), as tables in the summary and
#   $OUT/kernels.tar.gz; reuses the torch part's plans when it ran first.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
parts=" ${*:-all} "
[ "$parts" = " all " ] && parts=" checks attention racecheck mpi-bench bench profiled torch tokens attention-step kernels "
start_s=$(date +%s)
deadline=${STAGECRAFT_GPU_DEADLINE:-570}
left() { echo $((deadline - ($(date +%s) - start_s))); }
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

# check NAME TIMEOUT COMMAND...: one summary line (exit 77 is a skip, 124 a timeout), the output
# to the log (or to $check_log when set: the parallel checks). TIMEOUT is cut to what is left
# of the deadline; with under 10 s left the check is not run.
check() {
  local name=$1 limit=$2
  shift 2
  local remaining
  remaining=$(left)
  if [ "$remaining" -lt 10 ]; then
    say "FAIL $name: not run (deadline: STAGECRAFT_GPU_DEADLINE=$deadline s)"
    return 125
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  local to=${check_log:-$log}
  echo "=== $name: $*" >>"$to"
  local t0 rc
  t0=$(date +%s.%N)
  timeout "$limit" "$@" >>"$to" 2>&1
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

# check_bg NAME TIMEOUT COMMAND...: check in the background with its own log, which is appended
# to log.txt (under a lock) when it ends; `wait` collects them.
check_bg() {
  local name=$1
  (
    check_log=$work/log-$name.txt
    : >"$check_log"
    check "$@"
    rc=$?
    flock "$work/log.lock" cat "$check_log" >>"$log"
    exit $rc
  ) &
}

# summarise LABEL: the last stagerun --json run's step, prediction and bubble as one summary
# line (--json is JSON Lines; the summary record is the last line of type "summary").
summarise() {
  grep '"type":"summary"' "$log" | tail -1 |
    grep -oE '"(median_step_ms|predicted_step_ms|bubble|host_waits|host_wait_ms)":(\{[^}]*\}|[^,]*)' |
    tr '\n' ' ' | sed "s/^/  $1: /" >>"$summary"
  echo >>"$summary"
}

# mpirun for the GPU ranks (checks' mpi-gpu, part mpi-bench): the bundle's Open MPI (Debian 12's
# 4.1, relocated: bundle.sh), else this machine's mpirun with its own libmpi first
# (libmpi.so.40: one ABI from Open MPI 3 to 5); mpi_env is empty where there is neither.
mpi_env=()
if [ -x "$b/ompi/bin/mpirun" ]; then
  mpi_env=(OPAL_PREFIX="$b/ompi" PMIX_INSTALL_PREFIX="$b/ompi/pmix2"
    PMIX_MCA_mca_base_component_path="$b/ompi/pmix2/lib/pmix"
    OMPI_MCA_mca_base_component_show_load_errors=0 PATH="$b/ompi/bin:$PATH")
  mpirun_path=$b/ompi/bin/mpirun
elif command -v mpirun >/dev/null; then
  mpirun_path=$(command -v mpirun)
  mpi_env=(LD_LIBRARY_PATH="$(dirname "$(readlink -f "$mpirun_path")")/../lib:$LD_LIBRARY_PATH")
fi

if ! check probe 60 stagecraft-gpu-probe; then
  say "no usable GPU: nothing else runs"
  exit 1
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader 2>&1 |
  sed 's/^/gpu state: /' | tee -a "$summary"

if [[ $parts == *" checks "* ]]; then
  STAGECRAFT_TEST_BACKEND=cuda check_bg gradients 400 stagecraft_grad_tests
  check_bg conformance 400 stagecraft-conformance --backend cuda --skips "$b/skips.txt" --data "$b/data/onnx"
  check_bg pipelines 400 stagecraft_gpu_pipeline_tests
  # The fused attention kernels (issue 32) against the CPU's, forward and gradient.
  check_bg attention 120 stagecraft_gpu_attention_tests
  # The fused Gelu's kernels (issue 31) against a double reference, forward and gradient.
  check_bg gelu 60 stagecraft_gpu_gelu_tests
  wait
  grep -E "^conformance \(" "$work/log-conformance.txt" | tail -1 >>"$summary"
  grep -E "^\[doctest\] (test cases|assertions):" "$work/log-gradients.txt" "$work/log-pipelines.txt" \
    "$work/log-attention.txt" "$work/log-gelu.txt" |
    sed "s|^$work/log-||; s|\.txt:| |" >>"$summary"
  # GPU ranks under mpirun (ctest's gpu.mpi_train): 2 ranks against the one-process CUDA run,
  # NCCL where the ranks have a GPU each, else MPI through host memory.
  if [ ${#mpi_env[@]} -gt 0 ]; then
    check mpi-gpu 300 env "${mpi_env[@]}" bash "$b/mpi_test.sh" gpu_train "$mpirun_path" \
      "$b/bin/stagerun" "$b/bin/stagec" "$b/bin/stagecraft-make-samples" "$b/samples" \
      "$work/mpi-gpu"
    grep -E "^(pipe|interleaved|replicas|zero), " "$log" | tail -8 |
      sed 's/^/  mpi-gpu: /' >>"$summary"
  else
    say "SKIP mpi-gpu: no mpirun (neither in the bundle nor on this machine)"
  fi
  if command -v compute-sanitizer >/dev/null; then
    # Inference of every sample under memcheck, and training of the toy ($STAGECRAFT_GPU_SAMPLES).
    # racecheck is the part "racecheck".
    check_bg memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 1 \
      stagecraft_gpu_pipeline_tests -tc="inference*"
    STAGECRAFT_GPU_SAMPLES=toy.onnx check_bg memcheck-training 300 \
      compute-sanitizer --tool memcheck --error-exitcode 1 stagecraft_gpu_pipeline_tests -tc="pipelined*"
    wait
  else
    say "SKIP memcheck, racecheck: compute-sanitizer is not on this machine"
  fi
fi

if [[ $parts == *" attention "* ]]; then
  for kernels in mma mma-ldmatrix mma-async mma-expf tiled tensor-core plain; do
    STAGECRAFT_ATTENTION_KERNELS=$kernels check "attention ($kernels)" 120 stagecraft_gpu_attention_tests
  done
  if command -v compute-sanitizer >/dev/null; then
    for kernels in mma mma-ldmatrix mma-async mma-expf tiled tensor-core; do
      STAGECRAFT_ATTENTION_KERNELS=$kernels check "racecheck attention ($kernels)" 120 \
        compute-sanitizer --tool racecheck --error-exitcode 1 stagecraft_gpu_attention_tests
    done
  fi
fi

if [[ $parts == *" racecheck "* ]]; then
  # Shared-memory hazards, over the kernels that use shared memory (the block reductions of
  # norm_block.cuh and reduce_kernels.cu), forward and gradient, through the kernel harness.
  # Not over whole pipelines: on the 2026-11-25 H100 lease racecheck lost track of a launch
  # from the device threads ("Internal Sanitizer Error") and made no progress in 300 s.
  STAGECRAFT_TEST_BACKEND=cuda check racecheck 300 compute-sanitizer --tool racecheck \
    --error-exitcode 1 stagecraft_grad_tests \
    -tc="grad LayerNorm*,grad Reduce*,grad Softmax*,grad InstanceNorm*"
fi

if [[ $parts == *" mpi-bench "* ]]; then
  # Issue 14's GPU figure: GPU ranks under mpirun against the one-process CUDA run of the same
  # plan (bench/mpi_ranks.sh: 2- and 4-device pipelines, 2 replicas x 2 stages; gpt_tiny, its
  # table to the summary). Ranks on one GPU exchange through host memory; threads, by copies.
  if [ ${#mpi_env[@]} -gt 0 ]; then
    check mpi-bench 300 env "${mpi_env[@]}" BACKEND=cuda DEVICE_SPEC=h100 STAGEC="$b/bin/stagec" \
      STAGERUN="$b/bin/stagerun" MPIRUN="$mpirun_path" MODEL="$b/samples/gpt_tiny.onnx" \
      BATCH=64 M=8 STEPS=20 ROUNDS=2 bash bench/mpi_ranks.sh
    grep -E "^(machine:|.*gpt_tiny|\| )" "$log" | tail -7 | sed 's/^/  mpi-bench: /' >>"$summary"
  else
    say "SKIP mpi-bench: no mpirun (neither in the bundle nor on this machine)"
  fi
fi

if [[ $parts == *" bench "* ]]; then
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
        check "plan $model $devices $mode" 300 stagec "$b/samples/$model.onnx" -o "$plan" $flags || continue
        if check "run $model $devices $mode" 300 stagerun "$plan" --backend cuda --steps 20 --json -q; then
          summarise "$model $devices $mode"
        fi
      done
    done
  done
fi

if [[ $parts == *" profiled "* ]]; then
  # GPT-2 small's shape (bench/gpu_vs_pytorch.sh's model), batch 8 of seq 1024, planned from a
  # --profile cuda database on 1 and 2 devices sharing the GPU: measured step against predicted.
  p=$work/profiled
  mkdir -p "$p"
  stagecraft-make-samples gpt --layers 12 --width 768 --heads 12 --seq 1024 --vocab 50257 --tied \
    --external-data -o "$p/gpt2s.onnx" >>"$log" 2>&1
  for devices in 1 2; do
    plan=$p/gpt2s-$devices
    check "plan gpt2s $devices train (profile cuda)" 300 stagec "$p/gpt2s.onnx" -o "$plan" \
      --devices $devices --batch 8 --microbatches $((devices == 1 ? 1 : 4)) --dim seq=1024 --train \
      --loss cross-entropy --profile cuda --profile-db "$p/profile-cuda.json" || continue
    if check "run gpt2s $devices train" 300 stagerun "$plan" --backend cuda --steps 6 --json -q; then
      summarise "gpt2s $devices train"
    fi
  done
fi

if [[ $parts == *" torch "* ]]; then
  # bench/gpu_vs_pytorch.sh reads the tools from PATH and writes its table to the summary.
  check torch "$(left)" env BUNDLE="$b" WORK="$work/torch" SUMMARY="$summary" \
    bash bench/gpu_vs_pytorch.sh
fi
if [[ $parts == *" tokens "* ]]; then
  plan=$work/torch/gpt2-mixed-plan
  if [ -d "$plan" ]; then
    head -c 4000000 /dev/urandom >"$work/text.bin"  # bytes: tokens 0..255, in GPT-2's vocabulary
    stagecraft-lm-data --tokens-out "$work/tokens.bin" --text "$work/text.bin" >>"$log" 2>&1
    for feed in synthetic tokens; do
      args=(--synthetic)
      [ $feed = tokens ] && args=(--tokens "$work/tokens.bin")
      if check "gpt2 mixed --$feed" 120 stagerun "$plan" --backend cuda --steps 9 --json -q \
          "${args[@]}"; then
        summarise "gpt2 mixed --$feed"
      fi
    done
  else
    say "SKIP tokens: no GPT-2 plan (run the torch part first)"
  fi
fi
if [[ $parts == *" attention-step "* ]]; then
  plan=$work/torch/gpt2-mixed-plan
  if [ -d "$plan" ]; then
    for kernels in tiled mma-expf mma mma-ldmatrix mma-async; do
      if STAGECRAFT_ATTENTION_KERNELS=$kernels check "gpt2 mixed, attention $kernels" 120 \
        stagerun "$plan" --backend cuda --steps 9 --json -q; then
        summarise "gpt2 mixed, attention $kernels"
      fi
    done
  else
    say "SKIP attention-step: no GPT-2 plan (run the torch part first)"
  fi
fi
if [[ $parts == *" kernels "* ]]; then
  check kernels "$(left)" env WORK="$work/torch" SUMMARY="$summary" BUDGET_S="$(left)" \
    bash bench/kernel_profile.sh
fi
say "done ($(( $(date +%s) - start_s )) s)"
