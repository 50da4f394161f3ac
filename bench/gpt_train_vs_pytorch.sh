#!/usr/bin/env bash
# gpt_train_vs_pytorch.sh: a GPT training step on the CPU, stagecraft against PyTorch, same
# machine, same run.
#
# The model is samples/scripts/export_torch_models.py's GPT (4 pre-norm layers, width 256, 8
# heads, vocab 1024; nn.MultiheadAttention with a causal mask, GELU MLP), batch 8 x seq 128:
#   stagecraft   its ONNX export planned on one device (stagec --devices 1 --microbatches 1
#                --train --loss cross-entropy --optimizer adam --device-spec cpu; the fused
#                Attention and Gelu as import makes them), stagerun --steps $STEPS
#                --threads-per-device T: median step after the first.
#   base         the same plan run by $BASE_STAGERUN, when set (an older build, for before/after).
#   PyTorch      bench/torch_gpt_train_step.py (the same module, cross-entropy, Adam, one
#                warm-up step, median of $STEPS), torch.set_num_threads(T):
#                  eager           Debian's python3-torch as installed (reference BLAS: slow);
#                  eager+openblas  with Debian's OpenMP build of OpenBLAS first on the library
#                                  path (OPENBLAS_NUM_THREADS=T): the fair peer for matmuls.
#                                  Runs when $OPENBLAS_DIR/libblas.so.3 exists; FETCH_OPENBLAS=1
#                                  fetches it (apt-get download libopenblas0-openmp, dpkg -x).
# Prints a markdown table: per thread count, each runner's median step and PyTorch's over
# stagecraft's.
#
# Environment: BUILD (default build), STEPS (8), THREADS ("1 2"), PY (/usr/bin/python3),
# BASE_STAGERUN, OPENBLAS_DIR ($CACHE/openblas/lib), FETCH_OPENBLAS (0), EAGER (0: skip the
# reference-BLAS PyTorch row, which takes seconds a step; 1 runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${STEPS:-8}
THREADS=${THREADS:-"1 2"}
PY=${PY:-/usr/bin/python3}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stagecraft-bench}
OPENBLAS_DIR=${OPENBLAS_DIR:-$CACHE/openblas/lib}
FETCH_OPENBLAS=${FETCH_OPENBLAS:-0}
EAGER=${EAGER:-0}
for tool in "$BUILD/tools/stagec" "$BUILD/tools/stagerun" ${BASE_STAGERUN:+"$BASE_STAGERUN"}; do
  [[ -x $tool ]] || { echo "gpt_train_vs_pytorch.sh: $tool not built (bash tools/build.sh, or set BUILD)" >&2; exit 1; }
done
"$PY" -c "import torch" 2>/dev/null ||
  { echo "gpt_train_vs_pytorch.sh: PyTorch not available to $PY (apt-get install python3-torch python3-torchvision)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source bench/openblas.sh

"$PY" samples/scripts/export_torch_models.py "$work" gpt 2>&1 | grep -v -i warn >&2 || true
"$BUILD/tools/stagec" "$work/gpt.onnx" -o "$work/plan" --devices 1 --microbatches 1 --batch 8 \
  --dim seq=128 --train --loss cross-entropy --optimizer adam --device-spec cpu >/dev/null

median_after_first() {  # stagerun --json on stdin -> the median of step_ms without the first
  "$PY" -c 'import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
s = [r for r in rows if r.get("type") == "summary"][0]
print("%.1f" % statistics.median(s["step_ms"][1:]))'
}
torch_step() {  # threads, then env assignments -> PyTorch's median step
  local t=$1; shift
  env "$@" "$PY" bench/torch_gpt_train_step.py --batch 8 --seq 128 --steps "$STEPS" --threads "$t" |
    "$PY" -c 'import json, sys; print("%.1f" % json.load(sys.stdin)["median_step_ms"])'
}
ratio() { "$PY" -c "print('%.2f' % ($1 / $2))"; }

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "stagecraft $(git rev-parse --short HEAD)$(git diff --quiet || echo '+local changes'), PyTorch $("$PY" -c 'import torch; print(torch.__version__)'); $STEPS timed steps"
echo
echo "| threads | stagecraft ms | base ms | PyTorch eager+openblas ms (x stagecraft) | PyTorch eager ms (x stagecraft) |"
echo "|---|---|---|---|---|"
for t in $THREADS; do
  sc=$("$BUILD/tools/stagerun" "$work/plan" --steps $((STEPS + 1)) --threads-per-device "$t" --json -q | median_after_first)
  base="-"
  [[ -n ${BASE_STAGERUN:-} ]] &&
    base=$("$BASE_STAGERUN" "$work/plan" --steps $((STEPS + 1)) --threads-per-device "$t" --json -q | median_after_first)
  ob="-"
  if (( have_openblas )); then
    ms=$(torch_step "$t" LD_LIBRARY_PATH="$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OPENBLAS_NUM_THREADS="$t")
    ob="$ms ($(ratio "$ms" "$sc"))"
  fi
  eager="-"
  if [[ $EAGER == 1 ]]; then
    ms=$(torch_step "$t")
    eager="$ms ($(ratio "$ms" "$sc"))"
  fi
  echo "| $t | $sc | $base | $ob | $eager |"
done
