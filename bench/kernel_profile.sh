#!/usr/bin/env bash
# Issue 31's per-kernel tables: where one training step's GPU time goes, stagerun's CUDA backend
# beside PyTorch eager on the same GPU, for the models of bench/gpu_vs_pytorch.sh (GPT-2 small's
# shape, batch 8 x 1024; ResNet-50, batch 64), fp32 and mixed/bf16.
#   stagecraft: one step (`stagerun --steps 1`) under Nsight Compute with only the kernel-duration
#     metric (gpu__time_duration.sum; --clock-control none: the card as found, and
#     --cache-control none), grouped by kernel name by bench/kernel_table.py. ncu serialises the
#     launches, so the sum is pure kernel time: the measured step minus it is host time and gaps.
#   stagecraft by node: `stagerun --profile-nodes` (every node of one step between CUDA events),
#     its table by op type with bytes moved, TFLOP/s and the share of the plan's device peak;
#     it needs no ncu, so it is made on any GPU machine.
#   PyTorch: bench/torch_gpu_step.py --kernels (torch.profiler over one step after the timed ones).
# Runs on a GPU machine after bench/gpu_vs_pytorch.sh, whose plans it reuses (WORK=its folder);
# stagec/stagerun/stagecraft-make-samples on PATH (tools/gpu/run.sh, part kernels).
#   WORK=/tmp/x SUMMARY=summary.txt bash bench/kernel_profile.sh
# Environment: CASES (model:precision pairs, in order; default "gpt2:mixed resnet50:mixed gpt2:fp32
# resnet50:fp32"), BUDGET_S (seconds; a case that would start with under 90 s left is reported
# as not run; default 600), TOP=25, NCU (default: PATH, then /opt/nvidia/nsight-compute/*/ncu,
# then /usr/local/cuda/bin/ncu).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
work=${WORK:-/tmp/stagecraft-gpu-vs-torch}
summary=${SUMMARY:-/dev/stdout}
out=${OUT:-$work}
py=${PYTHON:-python3}
top=${TOP:-25}
cases=${CASES:-gpt2:mixed resnet50:mixed gpt2:fp32 resnet50:fp32}
budget=${BUDGET_S:-600}
start_s=$(date +%s)
mkdir -p "$work/kernels"
note() { echo "$*" | tee -a "$summary"; }

ncu=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1 ||
  true)}
[ -n "$ncu" ] || [ ! -x /usr/local/cuda/bin/ncu ] || ncu=/usr/local/cuda/bin/ncu
if [ -z "$ncu" ]; then
  note "SKIP kernel profile: no ncu (Nsight Compute) on this machine"
fi

# The plans gpu_vs_pytorch.sh made; made here when it did not run.
plan_for() {
  local model=$1 precision=$2 plan=$work/$1-$2-plan
  [ -f "$plan/plan.json" ] && { echo "$plan"; return; }
  case $model in
    gpt2)
      [ -f "$work/gpt2s.onnx" ] || stagecraft-make-samples gpt --layers 12 --width 768 --heads 12 \
        --seq 1024 --vocab 50257 --tied --external-data -o "$work/gpt2s.onnx" >/dev/null
      stagec "$work/gpt2s.onnx" -o "$plan" --devices 1 --microbatches 1 --train --device-spec h100 \
        --precision "$precision" --batch 8 --dim seq=1024 --loss cross-entropy >/dev/null ;;
    resnet50)
      [ -f "$work/resnet50.onnx" ] ||
        "$py" bench/torch_gpu_step.py export-resnet50 "$work/resnet50.onnx" --image 224 >/dev/null
      stagec "$work/resnet50.onnx" -o "$plan" --devices 1 --microbatches 1 --train \
        --device-spec h100 --precision "$precision" --batch 64 --loss mse >/dev/null ;;
  esac || return 1
  echo "$plan"
}

for case in $cases; do
  model=${case%:*} precision=${case#*:}
  label="stagecraft $model $precision"
  tables=$work/kernels/$model-$precision.txt
  : >"$tables"
  if [ $((budget - ($(date +%s) - start_s))) -lt 90 ]; then
    note "SKIP kernels $case: not run (under 90 s of BUDGET_S=$budget left)"
    continue
  fi
  if plan=$(plan_for "$model" "$precision"); then
    rep=$work/kernels/$model-$precision
    # The step as it runs (not serialised by ncu): the median of 4 after a warm-up step; a
    # sixth step timed node by node (stagerun --profile-nodes, left out of the median) gives
    # stagecraft's own table by op type, with bytes, TFLOP/s and the share of the H100 spec.
    if stagerun "$plan" --backend cuda --steps 6 --profile-nodes --json -q >"$rep-run.jsonl" \
        2>"$rep-run.err"; then
      echo "$label: measured step $(grep '"type":"summary"' "$rep-run.jsonl" | "$py" -c \
        'import json,sys; print("%.1f ms" % json.load(sys.stdin)["median_step_ms"])')" >>"$tables"
      grep '"type":"node_profile"' "$rep-run.jsonl" | "$py" -c '
import json, sys
p = json.load(sys.stdin)
print("%s: --profile-nodes, step %d, %.1f ms of kernels (%s)" % (sys.argv[1], p["step"], p["kernel_ms"], p["clock"]))
print("  %-24s %6s %10s %6s %9s %8s %6s" % ("op type", "calls", "ms", "share", "GB/s", "TFLOP/s", "%peak"))
for r in p["by_op"][:int(sys.argv[2])]:
    print("  %-24s %6d %10.3f %5.1f%% %9.1f %8s %6s" % (r["op"], r["calls"], r["ms"], 100 * r["ms"] / max(p["kernel_ms"], 1e-9), r["gb_per_s"],
          "%.2f" % r["tflop_per_s"] if "tflop_per_s" in r else "-", "%.1f%%" % (100 * r["of_peak"]) if "of_peak" in r else "-"))
' "$label" "$top" >>"$tables" 2>&1 || note "FAIL node profile table $label"
    else
      note "FAIL stagerun $label: $(tail -1 "$rep-run.err")"
    fi
  else
    note "FAIL plan $label"
  fi
  if [ -n "$ncu" ]; then
    if plan=$(plan_for "$model" "$precision"); then
      rep=$work/kernels/$model-$precision
      # One step; ncu's own lines and stagerun's output to the log, the report to $rep.ncu-rep.
      # Launches capped (-c) so that a slow replay still ends with a report.
      if timeout 200 "$ncu" -c 4000 --target-processes all --metrics gpu__time_duration.sum \
          --clock-control none --cache-control none -f -o "$rep" \
          stagerun "$plan" --backend cuda --steps 1 -q >"$rep.log" 2>&1 &&
         "$ncu" -i "$rep.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum \
           --print-units base >"$rep.csv" 2>>"$rep.log"; then
        "$py" bench/kernel_table.py ncu "$rep.csv" "$label" --top "$top" >>"$tables" 2>&1 ||
          note "FAIL kernel table $label"
      else
        note "FAIL ncu $label: $(tail -2 "$rep.log" | tr '\n' ' ')"
      fi
    else
      note "FAIL plan $label"
    fi
  fi
  tprec=$precision
  [ "$precision" = mixed ] && tprec=bf16
  if [ "$model" = gpt2 ]; then shape=(--batch 8 --seq 1024); else shape=(--batch 64 --image 224); fi
  k=$work/kernels/torch-$model-$tprec.json
  if "$py" bench/torch_gpu_step.py "$model" "${shape[@]}" --mode eager --precision "$tprec" \
      --steps 4 --warmup 2 --kernels "$k" >"$k.step" 2>"$k.err"; then
    echo "pytorch eager $model $tprec: measured step $("$py" -c \
      'import json,sys; print("%.1f ms" % json.load(open(sys.argv[1]))["median_step_ms"])' \
      "$k.step")" >>"$tables"
    "$py" bench/kernel_table.py torch "$k" "pytorch eager $model $tprec" --top "$top" \
      >>"$tables" 2>&1 || note "FAIL kernel table pytorch $model $tprec"
  else
    note "FAIL pytorch kernels $model $tprec: $(tail -1 "$k.err")"
  fi
  # The case's tables without their JSON record lines to the summary, and everything so far to
  # $OUT/kernels.tar.gz, case by case: a run cut short keeps what it measured.
  grep -v '^{' "$tables" >>"$summary"
  tar -C "$work" --exclude='*.ncu-rep' -czf "$out/kernels.tar.gz" kernels
done
