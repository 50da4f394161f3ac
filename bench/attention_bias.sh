#!/usr/bin/env bash
# A T5-style encoder (a learned relative position bias added to every layer's scores), exported
# by PyTorch, trained on the CPU on one device: fused attention, whose mask takes its gradient
# (mask_gradient), against the exporter's ops (stagec --no-fuse-attention). Prints, for each,
# the predicted and measured peak, the median step and the last loss, and PyTorch's own median
# step on the same model and batch (eager, the same threads, with OpenBLAS as
# bench/openblas.sh fetches it: FETCH_OPENBLAS=0 to skip). Before 2026-12-01 a training plan
# left these blocks unfused, as the fused op gave its mask no gradient.
#
#   bash bench/attention_bias.sh [BUILD_DIR] [SEQ]     (defaults: build, 512)
#
# Needs Debian's python3-torch (PyTorch 1.13). KEEP=1 keeps the work folder (plans, data).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seq=${2:-512}
steps=6
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
echo "work folder: $work"
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stagecraft-bench}
OPENBLAS_DIR=${OPENBLAS_DIR:-$CACHE/openblas/lib}
FETCH_OPENBLAS=${FETCH_OPENBLAS:-1}
source bench/openblas.sh
threads=$(nproc)

# The model and its data ("export"); PyTorch's own step otherwise: 2 microbatches of 4, Adam,
# as the plans below.
cat > "$work/model.py" <<'PY'
import sys, time, statistics
import numpy as np
import torch
sys.path.insert(0, "samples/scripts")
from check_torch_models import T5Encoder

work, seq, mode, threads = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.manual_seed(0)
torch.set_num_threads(threads)
model = T5Encoder(vocab=1000, d=256, heads=8, layers=4)
ids = torch.randint(0, 1000, (8, seq))
labels = torch.randint(0, 10, (8,))
if mode == "export":
    torch.onnx.export(model, (ids,), f"{work}/t5.onnx", input_names=["ids"],
                      output_names=["output"], dynamic_axes={"ids": {0: "batch"}}, opset_version=17)
    np.save(f"{work}/in/ids.npy", ids.numpy())
    np.save(f"{work}/in/labels.npy", labels.numpy())
    sys.exit(0)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
times = []
for step in range(4):
    start = time.perf_counter()
    opt.zero_grad()
    for half in (slice(0, 4), slice(4, 8)):
        (torch.nn.functional.cross_entropy(model(ids[half]), labels[half]) / 2).backward()
    opt.step()
    times.append((time.perf_counter() - start) * 1e3)
print(f"pytorch eager ({mode}), {torch.get_num_threads()} threads: median step "
      f"{statistics.median(times[1:]):.1f} ms")
PY
mkdir -p "$work/in"
/usr/bin/python3 "$work/model.py" "$work" "$seq" export "$threads" 2>/dev/null
# Debian's torch runs its products on the reference BLAS (6 GFLOP/s here) unless OpenBLAS is
# first on the library path.
if (( have_openblas )); then
  LD_LIBRARY_PATH="$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    OPENBLAS_NUM_THREADS=$threads /usr/bin/python3 "$work/model.py" "$work" "$seq" openblas \
    "$threads"
else
  /usr/bin/python3 "$work/model.py" "$work" "$seq" "reference BLAS" "$threads"
fi

for variant in fused unfused; do
  flags=()
  [ "$variant" = unfused ] && flags=(--no-fuse-attention)
  "$build/tools/stagec" "$work/t5.onnx" -o "$work/plan_$variant" --devices 1 --batch 8 \
    --microbatches 2 --train --optimizer adam --loss cross-entropy --loss-axis 1 \
    --device-spec cpu "${flags[@]}" > "$work/stagec_$variant.log"
  "$build/tools/stagerun" "$work/plan_$variant" --steps "$steps" --inputs "$work/in" --json -q \
    > "$work/run_$variant.jsonl"
  /usr/bin/python3 - "$work/run_$variant.jsonl" "$variant" "$work/plan_$variant" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
summary = next(r for r in records if r["type"] == "summary")
device = summary["device"][0]
ops = json.load(open(sys.argv[3] + "/plan.json"))["ops"]
fused = sum(op.get("op_type") == "Attention" for op in ops)
mib = 1 << 20
print(f"{sys.argv[2]}: {fused} Attention nodes; peak {device['peak_bytes'] / mib:.1f} MiB "
      f"(predicted {device['predicted_peak_bytes'] / mib:.1f}); median step "
      f"{summary['median_step_ms']:.1f} ms; loss {summary['final_loss']:.6f}")
PY
done
