#!/usr/bin/env bash
# The classic single-machine model-parallel experiment (PyTorch's "single-machine model
# parallel" tutorial), trained by stagerun on 2 CPU devices of one core each:
#   ResNet-50 (torchvision, random weights, BatchNorm folded by the ONNX export), batch 120 of
#   3x128x128, 1000 outputs, MSE loss, SGD lr 0.001; one run = 3 training batches.
#
# Rows (every stagerun with --threads-per-device 1, so a device is one core):
#   single device         stagec --devices 1 --microbatches 1
#   model parallel        stagec --devices 2 --split-after layer2's last ReLU --microbatches 1
#                         (layer1-2 | layer3-4, no pipelining: one device waits for the other)
#   pipelined, split S    the same split, microbatches of S images (M = 120/S), GPipe schedule,
#                         for S in $SPLITS (the tutorial's sweep: 1 3 5 8 10 12 20 40 60)
#   stagec's split        --devices 2 with no --split-after: the planner's own cut (speed
#                         objective), microbatches of $PLANNER_SPLIT, 1F1B
#   PyTorch               bench/torch_train_step.py on 1 thread: the folded model (the same
#                         computation) and torchvision's model with BatchNorm in train mode
# Each stagerun process runs 1 warm-up step and then the 3 batches; the run time is the sum of
# those 3 step times (stagerun --json step_ms). Every configuration is run $REPEAT times (fresh
# processes); the table gives the median and the spread (min-max) of the run times, the
# predicted run time (3 x the plan's predicted step), the measured and predicted bubble, and
# each device's measured peak memory (stagerun's meter) beside the plan's.
# Predictions use --profile cpu (PROFILE=1, the default: each op's forward and gradient nodes
# measured at each microbatch shape first, ~2 min in all), or with PROFILE=0 the analytic
# --device-spec cpu roofline.
#
# Usage (repo root, after bash tools/build.sh; needs python3-torch, python3-torchvision and
# python3-matplotlib from Debian for the model export, the PyTorch rows and the plot):
#   bash bench/resnet50_training.sh            # ~25 min on 2 cores
# Environment: BUILD=build MODELS=/tmp/stagecraft-models REPEAT=2 SPLITS="1 3 5 8 10 12 20 40 60"
#   PLANNER_SPLIT=20 PROFILE=1 OUT=bench (where resnet50_training.{json,svg} go).
# Run it on an otherwise idle machine: the 2-device rows need both cores.
set -euo pipefail
BUILD=${BUILD:-build}
MODELS=${MODELS:-/tmp/stagecraft-models}
REPEAT=${REPEAT:-2}
SPLITS=${SPLITS:-"1 3 5 8 10 12 20 40 60"}
PLANNER_SPLIT=${PLANNER_SPLIT:-20}
PROFILE=${PROFILE:-1}
OUT=${OUT:-bench}
BATCH=120
STEPS=3
PY=/usr/bin/python3
MODEL="$MODELS/resnet50_128.onnx"
CUT=/layer2/layer2.3/relu_2/Relu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -f "$MODEL" ]; then
  "$PY" samples/scripts/export_torch_models.py "$MODELS" resnet50_128 >&2
fi
cost=(--device-spec cpu)
[ "$PROFILE" = 1 ] && cost=(--profile cpu --profile-db "$work/profile.json")

echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$(date -u +%F), $MODEL, batch $BATCH of 3x128x128, MSE, SGD lr 0.001, $STEPS batches per run, $REPEAT runs each"
results="$work/results.jsonl"
: >"$results"

# plan NAME DEVICES MICROBATCHES SCHEDULE [stagec args...]
run_config() {
  local name=$1 devices=$2 m=$3 schedule=$4
  shift 4
  "$BUILD/tools/stagec" "$MODEL" -o "$work/plan" --devices "$devices" --train --loss mse --optimizer sgd \
    --lr 0.001 --batch $BATCH --microbatches "$m" --schedule "$schedule" "${cost[@]}" "$@" >/dev/null
  for r in $(seq "$REPEAT"); do
    # --json: one line per step, then the summary record, the last line.
    "$BUILD/tools/stagerun" "$work/plan" --steps $((STEPS + 1)) --threads-per-device 1 --json -q |
      tail -n 1 >"$work/run.json"
    "$PY" - "$work/run.json" "$name" "$devices" "$m" "$STEPS" >>"$results" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
name, devices, m, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(json.dumps({"name": name, "devices": devices, "microbatches": m,
                  "split": 120 // m, "run_s": sum(j["step_ms"][1:]) / 1e3,
                  "predicted_run_s": steps * j["predicted_step_ms"] / 1e3,
                  "bubble": j["bubble"]["measured"], "predicted_bubble": j["bubble"]["predicted"],
                  "peak_bytes": [d["peak_bytes"] for d in j["device"]],
                  "predicted_peak_bytes": [d["predicted_peak_bytes"] for d in j["device"]],
                  "rss_bytes": j.get("process_peak_rss_bytes", 0),
                  "final_loss": j.get("final_loss")}))
PY
  done
  echo "  $name: done ($(tail -n 1 "$results" | cut -c1-80)...)" >&2
}

run_config "single device" 1 1 gpipe
run_config "model parallel (no pipelining)" 2 1 gpipe --split-after "$CUT"
for s in $SPLITS; do
  run_config "pipelined, split $s" 2 $((BATCH / s)) gpipe --split-after "$CUT"
done
run_config "stagec's split (1f1b), split $PLANNER_SPLIT" 2 $((BATCH / PLANNER_SPLIT)) 1f1b

torch_json="$work/torch.jsonl"
: >"$torch_json"
for variant in folded batchnorm; do
  if ! "$PY" bench/torch_train_step.py --batch $BATCH --image 128 --lr 0.001 --batches $STEPS \
    --repeat "$REPEAT" --threads 1 --variant $variant >>"$torch_json"; then
    echo "PyTorch rows skipped (torch_train_step.py failed)" >&2
    break
  fi
done

"$PY" - "$results" "$torch_json" "$OUT" <<'PY'
import json, statistics, sys
rows, torch_rows, out = [json.loads(l) for l in open(sys.argv[1])], \
    [json.loads(l) for l in open(sys.argv[2])], sys.argv[3]
by = {}
for r in rows:
    by.setdefault(r["name"], []).append(r)
gib = lambda b: b / 2**30
single = statistics.median(r["run_s"] for r in by["single device"])
print()
print("| configuration | devices | microbatch | run s (median, min-max) | predicted s | speed-up vs single | bubble measured / predicted | peak GiB per device (measured / predicted) |")
print("|---|---|---|---|---|---|---|---|")
summary = []
for name, rs in by.items():
    runs = [r["run_s"] for r in rs]
    med = statistics.median(runs)
    r0 = rs[0]
    peaks = ", ".join(f"{gib(m):.2f} / {gib(p):.2f}" for m, p in
                      zip(r0["peak_bytes"], r0["predicted_peak_bytes"]))
    print(f"| {name} | {r0['devices']} | {r0['split']} | {med:.1f} ({min(runs):.1f}-{max(runs):.1f}) | "
          f"{r0['predicted_run_s']:.1f} | {single / med:.2f}x | "
          f"{100 * r0['bubble']:.0f}% / {100 * r0['predicted_bubble']:.0f}% | {peaks} |")
    summary.append({"name": name, "devices": r0["devices"], "split": r0["split"], "runs_s": runs,
                    "median_run_s": med, "predicted_run_s": r0["predicted_run_s"],
                    "bubble": r0["bubble"], "predicted_bubble": r0["predicted_bubble"],
                    "peak_bytes": r0["peak_bytes"], "predicted_peak_bytes": r0["predicted_peak_bytes"],
                    "rss_bytes": r0["rss_bytes"]})
for t in torch_rows:
    label = {"folded": "PyTorch 1 thread, BatchNorm folded (same computation)",
             "batchnorm": "PyTorch 1 thread, BatchNorm in train mode"}[t["variant"]]
    runs = t["run_s"]
    print(f"| {label} | 1 | 120 | {t['median_run_s']:.1f} ({min(runs):.1f}-{max(runs):.1f}) | - | "
          f"{single / t['median_run_s']:.2f}x | - | - |")
    summary.append({"name": label, "devices": 1, "split": 120, "runs_s": runs,
                    "median_run_s": t["median_run_s"]})
json.dump(summary, open(f"{out}/resnet50_training.json", "w"), indent=1)

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("\n(no plot: python3-matplotlib is missing)")
    sys.exit(0)
sweep = [s for s in summary if s["name"].startswith("pipelined, split")]
sweep.sort(key=lambda s: s["split"])
fig, ax = plt.subplots(figsize=(7, 4.2))
xs = [s["split"] for s in sweep]
ax.plot(xs, [s["median_run_s"] for s in sweep], "o-", label="pipelined, measured (median)")
ax.plot(xs, [s["predicted_run_s"] for s in sweep], "x--", label="pipelined, predicted")
for s, style in ((summary[0], "C2"), (summary[1], "C3")):
    ax.axhline(s["median_run_s"], color=style, linestyle=":", label=s["name"])
for t in summary:
    if t["name"].startswith("PyTorch") and "folded" in t["name"]:
        ax.axhline(t["median_run_s"], color="C4", linestyle="-.", label="PyTorch, 1 thread (folded)")
ax.set_xscale("log")
ax.set_xticks(xs)
ax.set_xticklabels([str(x) for x in xs])
ax.set_xlabel("microbatch size (images; batch 120)")
ax.set_ylabel("seconds per run (3 batches)")
ax.set_title("ResNet-50 training on 2 CPU devices of 1 core (stagerun)")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(f"{out}/resnet50_training.svg")
print(f"\nwrote {out}/resnet50_training.json and {out}/resnet50_training.svg")
PY
