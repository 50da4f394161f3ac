#!/usr/bin/env bash
# One-GPU training steps, stagerun's CUDA backend against PyTorch on the same GPU (issue 13):
#   GPT-2 small's shape (124M parameters, seq 1024, vocabulary 50257, tied head), batch 8,
#     cross-entropy, AdamW lr 1e-3;
#   ResNet-50 (torchvision, random weights, BatchNorm folded by the ONNX export), batch 64 of
#     3x224x224, MSE against [64,1000], AdamW lr 1e-3.
# stagecraft: `stagec --devices 1 --microbatches 1 --train --device-spec h100`, then
#   `stagerun --backend cuda --steps $((STEPS + 1)) --json`: the median of the steps after the
#   first; at --precision fp32 (CUDA's fp32 without TF32) and at --precision mixed (bf16 MatMul
#   through cuBLAS with fp32 accumulation, fp32 master weights and optimizer state).
# PyTorch (bench/torch_gpu_step.py, the same median over CUDA events after 3 warm-up steps):
#   eager and torch.compile with bf16 autocast (what a PyTorch user runs), and eager fp32 with
#   TF32 off (the same arithmetic as stagecraft's).
# MFU: 3 x the forward FLOPs stagec --info counts (the same count for both sides) per step over
#   the step time, against the H100 SXM's dense bf16 peak (989 TFLOP/s) and fp32 peak (67).
#
# Runs on a GPU machine from tools/gpu/run.sh's bundle (stagec, stagerun and
# stagecraft-make-samples on PATH; python3 with torch and torchvision, as the device image has).
#   BUNDLE=... WORK=/tmp/x SUMMARY=summary.txt bash bench/gpu_vs_pytorch.sh
# Environment: STEPS=8, GPT_BATCH=8, RESNET_BATCH=64, MODELS="gpt2 resnet50" (either or both).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
work=${WORK:-/tmp/stagecraft-gpu-vs-torch}
summary=${SUMMARY:-/dev/stdout}
steps=${STEPS:-8}
gpt_batch=${GPT_BATCH:-8}
resnet_batch=${RESNET_BATCH:-64}
py=${PYTHON:-python3}
models=" ${MODELS:-gpt2 resnet50} "
mkdir -p "$work"
results=$work/results.jsonl
: >"$results"
note() { echo "$*" | tee -a "$summary"; }

# ours NAME MODEL SHAPE_ARGS PRECISION TRAIN_ARGS...: plan and run one model at stagec's
# --precision PRECISION (fp32, or mixed: bf16 compute with fp32 master weights); appends its
# record to results.jsonl. SHAPE_ARGS (one word, split): --batch and --dim, which --info takes too.
ours() {
  local name=$1 model=$2 shape=$3 precision=$4
  shift 4
  local tag=$name-$precision
  local flops
  # shellcheck disable=SC2086
  flops=$(stagec "$model" --info $shape | awk '$1 == "forward" { print $2, $3 }')
  [ -n "$flops" ] || { note "FAIL stagec --info $name: no forward FLOPs"; return 1; }
  # shellcheck disable=SC2086
  set -- $shape "$@"
  if ! stagec "$model" -o "$work/$tag-plan" --devices 1 --microbatches 1 --train --device-spec h100 \
      --precision "$precision" "$@" >"$work/$tag-stagec.txt" 2>&1; then
    note "FAIL stagec $tag: $(tail -1 "$work/$tag-stagec.txt")"
    return 1
  fi
  if ! stagerun "$work/$tag-plan" --backend cuda --steps $((steps + 1)) --json -q \
      >"$work/$tag-run.jsonl" 2>"$work/$tag-run.err"; then
    note "FAIL stagerun $tag: $(tail -1 "$work/$tag-run.err")"
    return 1
  fi
  tail -n 1 "$work/$tag-run.jsonl" |
    "$py" -c 'import json,sys; j=json.load(sys.stdin); n,f,p=sys.argv[1],sys.argv[2].split(),sys.argv[3];
u={"GFLOP":1e9,"MFLOP":1e6,"TFLOP":1e12,"kFLOP":1e3,"FLOP":1}
print(json.dumps({"model":n,"mode":"stagecraft","precision":p,"median_step_ms":j["median_step_ms"],
 "step_ms":j["step_ms"],"predicted_step_ms":j.get("predicted_step_ms"),"final_loss":j.get("final_loss"),
 "peak_bytes":[d.get("device_peak_bytes",d["peak_bytes"]) for d in j["device"]],
 "predicted_peak_bytes":[d["predicted_peak_bytes"] for d in j["device"]],
 "host_waits":[d.get("host_waits") for d in j["device"]],
 "host_wait_ms":[d.get("host_wait_ms") for d in j["device"]],
 "forward_flops":float(f[0].replace(",",""))*u[f[1].split("/")[0]]}))' "$name" "$flops" \
    "$precision" >>"$results"
  echo "stagecraft $tag: $(tail -1 "$results")" >&2
}

# theirs MODEL ARGS...: one PyTorch configuration.
theirs() {
  local out
  if out=$("$py" bench/torch_gpu_step.py "$@" --steps "$steps" 2>"$work/torch.err"); then
    echo "$out" >>"$results"
    echo "pytorch $*: $out" >&2
  else
    note "FAIL pytorch $*: $(tail -1 "$work/torch.err")"
  fi
}

note "gpu_vs_pytorch: $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F), $steps timed steps each"
# GPT-2 small's shape.
if [[ $models == *" gpt2 "* ]]; then
stagecraft-make-samples gpt --layers 12 --width 768 --heads 12 --seq 1024 --vocab 50257 --tied \
  --external-data -o "$work/gpt2s.onnx" >/dev/null
for precision in fp32 mixed; do
  ours gpt2 "$work/gpt2s.onnx" "--batch $gpt_batch --dim seq=1024" $precision --loss cross-entropy
done
for cfg in eager:bf16 compile:bf16 eager:fp32; do
  theirs gpt2 --batch "$gpt_batch" --seq 1024 --mode "${cfg%:*}" --precision "${cfg#*:}"
done
fi
# ResNet-50.
if [[ $models == *" resnet50 "* ]]; then
"$py" bench/torch_gpu_step.py export-resnet50 "$work/resnet50.onnx" --image 224 >/dev/null 2>"$work/export.err" ||
  note "FAIL resnet50 export: $(tail -1 "$work/export.err")"
if [ -f "$work/resnet50.onnx" ]; then
  for precision in fp32 mixed; do
    ours resnet50 "$work/resnet50.onnx" "--batch $resnet_batch" $precision --loss mse
  done
fi
for cfg in eager:bf16 compile:bf16 eager:fp32; do
  theirs resnet50 --batch "$resnet_batch" --image 224 --mode "${cfg%:*}" --precision "${cfg#*:}"
done
fi

# The table: per model, each row's step, throughput, MFU and the ratio of its step to stagecraft's.
"$py" - "$results" "$gpt_batch" "$resnet_batch" <<'PY' | tee -a "$summary"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
batch = {"gpt2": int(sys.argv[2]) * 1024, "resnet50": int(sys.argv[3])}
unit = {"gpt2": "tokens/s", "resnet50": "images/s"}
for model in [m for m in ("gpt2", "resnet50") if any(r["model"] == m for r in rows)]:
    ours = next((r for r in rows if r["model"] == model and r["mode"] == "stagecraft"
                 and r["precision"] == "fp32"), None)
    if ours is None:
        print(f"{model}: no stagecraft figure")
    flops = 3 * ours["forward_flops"] if ours else None
    print(f"{model} (batch {batch[model]} {unit[model].split('/')[0]}; training FLOPs/step "
          f"{flops / 1e12:.2f} T)" if flops else model)
    print(f"  {'run':<26} {'step ms':>9} {unit[model]:>11} {'MFU bf16':>9} {'MFU fp32':>9} "
          f"{'vs stagecraft':>13} {'peak GiB':>9}")
    for r in rows:
        if r["model"] != model:
            continue
        ms = r["median_step_ms"]
        name = (f"stagecraft ({r['precision']})" if r["mode"] == "stagecraft"
                else f"pytorch {r['mode']} {r['precision']}")
        peak = r["peak_bytes"]
        peak = max(peak) if isinstance(peak, list) else peak
        mfu16 = f"{flops / (ms / 1e3) / 989e12:.1%}" if flops else "-"
        mfu32 = f"{flops / (ms / 1e3) / 67e12:.1%}" if flops else "-"
        ratio = f"{ours['median_step_ms'] / ms:.2f}x" if ours else "-"
        print(f"  {name:<26} {ms:>9.1f} {batch[model] / (ms / 1e3):>11.0f} {mfu16:>9} {mfu32:>9} "
              f"{ratio:>13} {peak / 2**30:>9.2f}")
    for r in rows:
        if r["model"] == model and r["mode"] == "stagecraft" and r.get("predicted_step_ms"):
            print(f"  stagecraft ({r['precision']}) predicted step {r['predicted_step_ms']:.1f} ms "
                  f"(h100 roofline), predicted peak {max(r['predicted_peak_bytes']) / 2**30:.2f} GiB, "
                  f"final loss {r.get('final_loss')}")
            waits = [w for w in r.get("host_waits") or [] if w is not None]
            if waits:
                blocked = sum(w for w in r.get("host_wait_ms") or [] if w is not None)
                print(f"  stagecraft ({r['precision']}) host waits in the step: {sum(waits)} "
                      f"synchronisations, {blocked:.1f} ms blocked")
PY
cp "$results" "${OUT:-$work}/gpu_vs_pytorch.jsonl" 2>/dev/null || true
for f in "$work"/*-run.jsonl; do cp "$f" "${OUT:-$work}/" 2>/dev/null || true; done
