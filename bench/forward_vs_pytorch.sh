#!/usr/bin/env bash
# Single-device forward (inference) throughput: stagecraft's CPU backend against PyTorch on the
# same machine, the same thread count, the same models and batch; plus a numerical cross-check
# of stagerun's outputs against PyTorch's for the same weights and input.
#
# Models (ONNX exports by samples/scripts/export_torch_models.py, PyTorch 1.13, opset 17):
#   resnet50  torchvision ResNet-50, batch 8, 3x224x224
#   gpt       the export script's GPT-style decoder (4 layers, width 256, 8 heads, vocabulary
#             1024), batch 8, --dim seq=128
# What runs, for each model and each thread count T in $THREADS:
#   stagecraft  stagec MODEL -o PLAN --devices 1 --microbatches 1 --batch 8 [--dim seq=128]
#               --device-spec cpu (one device: the plan does not change what runs), then
#               stagerun PLAN --steps $STEPS --json --threads-per-device T (synthetic input);
#               the first step is dropped as warm-up, the figure is the median of the rest.
#   PyTorch     bench/torch_forward.py time (Debian python3-torch, /usr/bin/python3): the same
#               modules (imported from the export script), torch.set_num_threads(T),
#               torch.inference_mode(), 2 warm-up steps, then the median of $STEPS-1 steps.
#               Variants, each a row:
#                 eager           as installed. Debian's torch calls BLAS through the libblas.so.3
#                                 alternative, on a stock system the netlib reference BLAS; and
#                                 at 1 thread it sends 1x1 convolutions with batch < 16 to its
#                                 im2col + BLAS path, not to oneDNN. The BLAS column says which.
#                 eager+openblas  the same with OpenBLAS (Debian's OpenMP build, which shares
#                                 torch's libgomp thread pool; OPENBLAS_NUM_THREADS=T) put first
#                                 on LD_LIBRARY_PATH as libblas.so.3: a fair baseline for
#                                 matmuls. Runs when $OPENBLAS_DIR (a folder holding OpenBLAS's
#                                 libblas.so.3) exists; FETCH_OPENBLAS=1 fills the default one
#                                 with `apt-get download libopenblas0-openmp` and `dpkg -x`
#                                 (nothing installed system-wide). Not the pthread build: its
#                                 own threads fight torch's OpenMP threads (2-3x slower at T=2).
#                 mkldnn          (ResNet-50 only) torch.utils.mkldnn.to_mkldnn(model): PyTorch's
#                                 own oneDNN inference path, weights packed once.
#   Ratio       stagecraft samples/s / PyTorch samples/s (above 1: stagecraft is faster).
# Cross-check: bench/torch_forward.py export writes a freshly seeded model (ResNet-50's
#   BatchNorms given random statistics so they are not identities), input.npy and PyTorch's
#   output; stagerun --inputs input.npy --outputs DIR on a 1-device plan and on a 2-device
#   plan with 2 microbatches; max |stagecraft - PyTorch| is printed beside max |PyTorch|.
#
# The machine may be shared: every figure is a median over steps, and the load average is
# printed before and after; compare rows measured in one run.
#
# Usage (from the repo root, after bash tools/build.sh):
#   bash bench/forward_vs_pytorch.sh
# Environment: BUILD=build (build dir), STEPS=7, THREADS="1 2", MODELS=<cache>/torch-models
#   (resnet50.onnx and gpt.onnx; exported there when missing), CACHE=${XDG_CACHE_HOME:-~/.cache}/
#   stagecraft-bench, PY=/usr/bin/python3, OPENBLAS_DIR=$CACHE/openblas/lib, FETCH_OPENBLAS=0,
#   CHECK=1 (0 skips the cross-check).
# Without python3-torch the PyTorch rows and the cross-check are skipped with a message; the
# stagecraft rows run when the ONNX files are already in $MODELS.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-7}
THREADS=${THREADS:-"1 2"}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stagecraft-bench}
MODELS=${MODELS:-$CACHE/torch-models}
PY=${PY:-/usr/bin/python3}
OPENBLAS_DIR=${OPENBLAS_DIR:-$CACHE/openblas/lib}
FETCH_OPENBLAS=${FETCH_OPENBLAS:-0}
CHECK=${CHECK:-1}
BATCH=8
SEQ=128
stagec=$BUILD/tools/stagec
stagerun=$BUILD/tools/stagerun
for t in "$stagec" "$stagerun"; do
  [[ -x $t ]] || { echo "forward_vs_pytorch.sh: $t not built (bash tools/build.sh, or set BUILD)" >&2; exit 1; }
done
(( STEPS >= 2 )) || { echo "forward_vs_pytorch.sh: STEPS must be at least 2" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

have_torch=0
if "$PY" -c "import torch, torchvision" 2>/dev/null; then
  have_torch=1
else
  echo "note: PyTorch not available to $PY (apt-get install python3-torch python3-torchvision):" \
       "PyTorch rows and the cross-check are skipped"
fi

# ONNX exports, into $MODELS when missing.
mkdir -p "$MODELS"
for m in resnet50 gpt; do
  if [[ ! -f $MODELS/$m.onnx ]]; then
    if (( have_torch )); then
      "$PY" samples/scripts/export_torch_models.py "$MODELS" "$m" 2>&1 | grep -v -i warn || true
    fi
  fi
done

# OpenBLAS for the eager+openblas rows.
source bench/openblas.sh

median_after_first() {  # stagerun --json (JSON Lines) on stdin -> median of the summary's step_ms[1:]
  jq 'select(.type == "summary") | [.step_ms[1:][]] | sort | if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end'
}
fmt() { printf "%.${2:-1}f" "$1"; }

echo "# forward throughput, stagecraft vs PyTorch"
echo
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1)," \
     "$(free -g | awk '/^Mem:/ {print $2}') GiB; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- stagecraft: $BUILD ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || echo '?'))," \
     "git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+local changes')"
(( have_torch )) && echo "- PyTorch: $("$PY" -c 'import torch; print(torch.__version__)') ($PY)"
echo "- figures: median of $((STEPS - 1)) steps after warm-up; samples/s = batch / median step"
echo

rows=()
for m in resnet50 gpt; do
  model=$MODELS/$m.onnx
  if [[ ! -f $model ]]; then
    echo "note: $model missing and PyTorch unavailable to export it; $m skipped"
    continue
  fi
  dims=()
  [[ $m == gpt ]] && dims=(--dim seq=$SEQ)
  "$stagec" "$model" -o "$work/$m" --devices 1 --microbatches 1 --batch $BATCH "${dims[@]}" \
    --device-spec cpu > "$work/$m.stagec.txt"
  for t in $THREADS; do
    "$stagerun" "$work/$m" --steps "$STEPS" --json --threads-per-device "$t" -q > "$work/$m.$t.json"
    sc_ms=$(median_after_first < "$work/$m.$t.json")
    sc_sps=$(echo "$BATCH / ($sc_ms / 1000)" | bc -l)
    shape="$m b$BATCH"
    [[ $m == gpt ]] && shape="$m b$BATCH seq$SEQ"
    if (( ! have_torch )); then
      rows+=("| $shape | $t | $(fmt "$sc_ms") | $(fmt "$sc_sps") | (PyTorch skipped) | | | | |")
      continue
    fi
    variants=(eager)
    (( have_openblas )) && variants+=(eager+openblas)
    [[ $m == resnet50 ]] && variants+=(mkldnn)
    for v in "${variants[@]}"; do
      mode=eager envs=()
      [[ $v == mkldnn ]] && mode=mkldnn
      [[ $v == eager+openblas ]] && envs=(LD_LIBRARY_PATH="$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OPENBLAS_NUM_THREADS="$t")
      env "${envs[@]}" "$PY" bench/torch_forward.py time "$m" --batch $BATCH --seq $SEQ --threads "$t" \
        --steps $((STEPS - 1)) --warmup 2 --mode "$mode" > "$work/$m.$t.$v.json" 2> "$work/torch.err" ||
        { cat "$work/torch.err" >&2; exit 1; }
      pt_ms=$(jq .median_step_ms "$work/$m.$t.$v.json")
      pt_sps=$(jq .samples_per_s "$work/$m.$t.$v.json")
      blas=$(jq -r .blas "$work/$m.$t.$v.json")
      rows+=("| $shape | $t | $(fmt "$sc_ms") | $(fmt "$sc_sps") | $v | $blas | $(fmt "$pt_ms") | $(fmt "$pt_sps") | $(fmt "$(echo "$sc_sps / $pt_sps" | bc -l)" 2) |")
    done
  done
done
echo "| model | threads | stagecraft step ms | stagecraft samples/s | PyTorch | PyTorch BLAS | PyTorch step ms | PyTorch samples/s | stagecraft / PyTorch |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
(( have_openblas || ! have_torch )) || echo "- eager+openblas rows skipped: no $OPENBLAS_DIR/libblas.so.3 (FETCH_OPENBLAS=1 fetches it)"

if (( ! have_torch )) || [[ $CHECK != 1 ]]; then
  (( have_torch )) || echo "- cross-check skipped: PyTorch not available"
  exit 0
fi

echo
echo "# cross-check: stagerun outputs vs PyTorch (same weights, same input)"
echo
echo "| model | plan | output | max abs diff | max abs PyTorch | max rel diff | all finite |"
echo "|---|---|---|---|---|---|---|"
status=0
for m in resnet50 gpt; do
  d=$work/check_$m
  "$PY" bench/torch_forward.py export "$m" --batch $BATCH --seq $SEQ --out "$d" --seed 7 > /dev/null 2>&1 ||
    { echo "forward_vs_pytorch.sh: export of $m failed" >&2; exit 1; }
  dims=()
  [[ $m == gpt ]] && dims=(--dim seq=$SEQ)
  for p in "1 1" "2 2"; do
    read -r devs mbs <<< "$p"
    "$stagec" "$d/model.onnx" -o "$d/plan$devs" --devices "$devs" --microbatches "$mbs" --batch $BATCH \
      "${dims[@]}" --device-spec cpu > /dev/null
    "$stagerun" "$d/plan$devs" --inputs "$d/input.npy" --outputs "$d/out$devs" --threads-per-device 1 -q > /dev/null
    r=$("$PY" bench/torch_forward.py compare "$d/reference.npy" "$d/out$devs/output.npy") || status=1
    if jq -e .error <<< "$r" > /dev/null; then
      echo "| $m b$BATCH | $devs dev, $mbs mb | output | $(jq -r .error <<< "$r") | | | |"
      continue
    fi
    echo "| $m b$BATCH | $devs device(s), $mbs microbatch(es) | $(jq -c .shape <<< "$r") |" \
         "$(jq -r '.max_abs_diff' <<< "$r" | xargs printf '%.2e') | $(jq -r '.max_abs_ref' <<< "$r" | xargs printf '%.4g') |" \
         "$(jq -r '.max_rel_diff' <<< "$r" | xargs printf '%.2e') | $(jq -r .finite <<< "$r") |"
    jq -e '.finite and .max_rel_diff < 1e-4' <<< "$r" > /dev/null || status=1
  done
done
(( status == 0 )) && echo && echo "- outputs agree (relative difference under 1e-4 everywhere)"
(( status == 0 )) || { echo; echo "- MISMATCH: stagerun's output differs from PyTorch's (see above)"; }
exit $status
