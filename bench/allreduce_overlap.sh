#!/usr/bin/env bash
# The data-parallel all-reduce overlapped with the backward (issue 14) against summing after it:
# one plan of 2 replicas x a 2-device pipeline, run in one process (`stagerun`, a thread per
# device) and as `mpirun --oversubscribe -np 4 stagerun`, each with
#   whole   --no-overlap --bucket-mb 100000: one bucket per stage, summed at ALLREDUCE after the
#           whole backward (the behaviour before buckets)
#   default --bucket-mb 25: here one bucket per stage too (the stages are far below 25 MiB),
#           started as soon as the stage's last backward has made it final
#   small   --bucket-mb $SMALL_MB: several buckets per stage, each started inside the last
#           backward right after the node computing its last gradient
# Per configuration: the step (median of the steps after each run's first, over the rounds),
# the all-reduce time per device (allreduce_ms: the time waited in ALLREDUCE, not the sums'
# time behind compute) and whether the final loss is the same as `whole`'s (it must be: 2
# replicas add two terms, in either order the same bits).
#
# Usage (repo root, after bash tools/build.sh):  bash bench/allreduce_overlap.sh
# Environment: BUILD=build, MODEL=samples/models/gpt_tiny.onnx, SEQ=64, BATCH=16, M=4 (per
# replica), STEPS=20, ROUNDS=3 (the configurations alternate within a round), SMALL_MB=0.05.
set -euo pipefail
BUILD=${BUILD:-build}
MODEL=${MODEL:-samples/models/gpt_tiny.onnx}
SEQ=${SEQ:-64}
BATCH=${BATCH:-16}
M=${M:-4}
STEPS=${STEPS:-20}
ROUNDS=${ROUNDS:-3}
SMALL_MB=${SMALL_MB:-0.05}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), load $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/tools/stagec" "$MODEL" -o "$work/plan" --devices 4 --data-parallel 2 --train \
  --loss cross-entropy --optimizer adam --lr 0.01 --batch "$BATCH" --microbatches "$M" \
  --dim seq="$SEQ" --schedule 1f1b --device-spec cpu >/dev/null
echo "$MODEL, 2 replicas x 2 devices, global batch $BATCH, seq $SEQ, $M microbatches per replica, $STEPS steps x $ROUNDS rounds, 1f1b, adam, 1 thread per device; $(mpirun --version | head -1)"
echo
declare -A flags=([whole]="--no-overlap --bucket-mb 100000" [default]="--bucket-mb 25"
  [small]="--bucket-mb $SMALL_MB")
configs=(whole default small)
for round in $(seq "$ROUNDS"); do
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    "$BUILD/tools/stagerun" "$work/plan" --steps "$STEPS" --json -q --backend cpu ${flags[$c]} \
      | tail -n 1 >"$work/one.$c.$round.json"
    # shellcheck disable=SC2086
    "${mpirun[@]}" -np 4 "$BUILD/tools/stagerun" "$work/plan" --steps "$STEPS" --json -q \
      ${flags[$c]} | tail -n 1 >"$work/mpi.$c.$round.json"
  done
done
echo "| where | configuration | step ms (median; per round) | all-reduce ms waited per device (median) | bubble | final loss as whole's |"
echo "|---|---|---|---|---|---|"
python3 - "$work" "$ROUNDS" "$SMALL_MB" <<'PY'
import json, statistics, sys
work, rounds, small = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = {"whole": "one bucket after the backward (--no-overlap)",
         "default": "25 MiB buckets, overlapped", "small": f"{small} MiB buckets, overlapped"}
for where, label in (("one", "one process"), ("mpi", "mpirun -np 4")):
    base = None
    for c in ("whole", "default", "small"):
        runs = [json.load(open(f"{work}/{where}.{c}.{r}.json")) for r in range(1, rounds + 1)]
        steps = [s for j in runs for s in j["step_ms"][1:]]
        per_round = ", ".join(f"{j['median_step_ms']:.2f}" for j in runs)
        ar = statistics.median(d["allreduce_ms"] for j in runs for d in j["device"])
        bubble = statistics.median(j["bubble"]["measured"] for j in runs)
        loss = runs[-1]["final_loss"]
        base = loss if base is None else base
        print(f"| {label} | {names[c]} | {statistics.median(steps):.2f} ({per_round}) | "
              f"{ar:.3f} | {100 * bubble:.1f}% | {'yes' if loss == base else f'{loss} vs {base}'} |")
PY
