#!/usr/bin/env bash
# CPU ranks against one process (issue 14): the same plan run by `stagerun` in one process (one
# thread per device) and by `mpirun -np N stagerun` (one process per device) on the same cores.
# Per plan: the step (median of the steps after the first), the measured bubble, the MPI run's
# extra time over the one-process run as a share of its step (what the processes and the MPI
# transport cost on top of the pipeline), and, with data parallelism, the all-reduce's time per
# device (stagerun's allreduce_ms: the time in ALLREDUCE, waiting for the other replica
# included).
#
# Usage (repo root, after bash tools/build.sh):  bash bench/mpi_ranks.sh
# Environment: BUILD=build, MODEL=samples/models/gpt_tiny.onnx, SEQ=64, BATCH=16, M=8 (per
# pipeline; the data-parallel plan's replicas take M/2 each, so every plan runs microbatches of
# BATCH/M samples), STEPS=20, ROUNDS=3 (one-process and mpirun runs alternate).
# GPU ranks (tools/gpu/run.sh's part mpi-bench): BACKEND=cuda DEVICE_SPEC=h100, with STAGEC,
# STAGERUN and MPIRUN naming the bundle's tools. Ranks that share the one GPU exchange through
# host memory (NCCL refuses two ranks on one GPU), threads in one process by device copies.
set -euo pipefail
BUILD=${BUILD:-build}
BACKEND=${BACKEND:-cpu}
DEVICE_SPEC=${DEVICE_SPEC:-cpu}
STAGEC=${STAGEC:-$BUILD/tools/stagec}
STAGERUN=${STAGERUN:-$BUILD/tools/stagerun}
MODEL=${MODEL:-samples/models/gpt_tiny.onnx}
SEQ=${SEQ:-64}
BATCH=${BATCH:-16}
M=${M:-8}
STEPS=${STEPS:-20}
ROUNDS=${ROUNDS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=("${MPIRUN:-mpirun}" --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$MODEL, global batch $BATCH, seq $SEQ, microbatches of $((BATCH / M)), $STEPS steps x $ROUNDS rounds, adam, 1 thread per device; $("${mpirun[0]}" --version | head -1), backend $BACKEND"
echo
echo "| plan | ranks | one process: step ms | mpirun: step ms | mpirun's extra | bubble one process | bubble mpirun | all-reduce ms per device (one process / mpirun) | final loss equal |"
echo "|---|---|---|---|---|---|---|---|---|"
plan() {  # NAME DEVICES REPLICAS
  "$STAGEC" "$MODEL" -o "$work/$1" --devices "$2" --data-parallel "$3" --train \
    --loss cross-entropy --optimizer adam --lr 0.01 --batch "$BATCH" --microbatches $((M / $3)) \
    --dim seq="$SEQ" --schedule 1f1b --device-spec "$DEVICE_SPEC" >/dev/null
}
run() {  # NAME DEVICES LABEL
  for round in $(seq "$ROUNDS"); do
    "$STAGERUN" "$work/$1" --steps "$STEPS" --json -q --backend "$BACKEND" | tail -n +$((STEPS + 1)) \
      >"$work/$1.one.$round.json"
    "${mpirun[@]}" -np "$2" "$STAGERUN" "$work/$1" --steps "$STEPS" --json -q --backend "$BACKEND" \
      | tail -n +$((STEPS + 1)) >"$work/$1.mpi.$round.json"
  done
  python3 - "$work/$1" "$2" "$3" "$ROUNDS" <<'PY'
import json, statistics, sys
base, ranks, label, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def load(kind):
    runs = [json.load(open(f"{base}.{kind}.{r}.json")) for r in range(1, rounds + 1)]
    steps = [s for j in runs for s in j["step_ms"][1:]]
    bubble = statistics.median(j["bubble"]["measured"] for j in runs)
    allreduce = [d.get("allreduce_ms") for j in runs for d in j["device"] if "allreduce_ms" in d]
    return statistics.median(steps), bubble, allreduce, runs[-1]["final_loss"]
one, one_bubble, one_ar, one_loss = load("one")
mpi, mpi_bubble, mpi_ar, mpi_loss = load("mpi")
ar = (f"{statistics.median(one_ar):.2f} / {statistics.median(mpi_ar):.2f}" if one_ar else "-")
print(f"| {label} | {ranks} | {one:.2f} | {mpi:.2f} | {100 * (mpi - one) / mpi:+.1f}% | "
      f"{100 * one_bubble:.1f}% | {100 * mpi_bubble:.1f}% | {ar} | "
      f"{'yes' if one_loss == mpi_loss else f'{one_loss} vs {mpi_loss}'} |")
PY
}
plan pp2 2 1
run pp2 2 "2-device pipeline"
plan pp4 4 1
run pp4 4 "4-device pipeline"
plan dp2pp2 4 2
run dp2pp2 4 "2 replicas x 2-device pipeline"
