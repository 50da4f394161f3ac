#!/usr/bin/env bash
# ZeRO-1's memory (issue 14, stagec --shard-optimizer): the same model planned for 2 replicas x 2
# pipeline devices with and without --shard-optimizer; per device the planner's predicted peak
# and optimizer state (plan.json device_memory) and stagerun's measured peak (its memory meter:
# every tensor the device holds), in one process and under `mpirun -np 4`; and the losses of
# the two plans (equal bit for bit with 2 replicas).
#
# Usage (repo root, after bash tools/build.sh):  bash bench/zero_memory.sh
# Environment: BUILD=build, MODEL=samples/models/gpt_tiny.onnx, SEQ=64, BATCH=16, M=4 (per
# replica), STEPS=4, OPTIMIZER=adam.
set -euo pipefail
BUILD=${BUILD:-build}
MODEL=${MODEL:-samples/models/gpt_tiny.onnx}
SEQ=${SEQ:-64}
BATCH=${BATCH:-16}
M=${M:-4}
STEPS=${STEPS:-4}
OPTIMIZER=${OPTIMIZER:-adam}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
common=("$MODEL" --train --loss cross-entropy --optimizer "$OPTIMIZER" --lr 0.001 --batch "$BATCH"
  --microbatches "$M" --dim seq="$SEQ" --devices 4 --data-parallel 2 --device-spec cpu)
echo "$MODEL, seq $SEQ, global batch $BATCH = 2 replicas x $M microbatches, $OPTIMIZER, 2 replicas x 2 devices, $STEPS steps"
echo "plans: stagec ${common[*]} -o PLAN [--shard-optimizer]"
echo
echo "| plan | device | predicted optimizer state | predicted peak | measured peak (one process) | measured peak (mpirun -np 4) |"
echo "|---|---|---|---|---|---|"
for plan in plain zero; do
  flags=()
  [ "$plan" = zero ] && flags=(--shard-optimizer)
  "$BUILD/tools/stagec" "${common[@]}" "${flags[@]}" -o "$work/$plan" >/dev/null
  "$BUILD/tools/stagerun" "$work/$plan" --steps "$STEPS" --json -q --backend cpu >"$work/$plan.one.json"
  "${mpirun[@]}" -np 4 "$BUILD/tools/stagerun" "$work/$plan" --steps "$STEPS" --json -q \
    >"$work/$plan.mpi.json" 2>/dev/null
  python3 - "$work/$plan" "$plan" <<'PY'
import json, sys
base, name = sys.argv[1], sys.argv[2]
plan = json.load(open(base + "/plan.json"))
def summary(path):
    return [json.loads(l) for l in open(path) if '"summary"' in l][-1]
one, mpi = summary(base + ".one.json"), summary(base + ".mpi.json")
for g, (a, b) in enumerate(zip(one["device"], mpi["device"])):
    peak = plan["device_memory"][g % plan["devices"]]
    print(f"| {'--shard-optimizer' if name == 'zero' else 'unsharded'} | {g} (replica {g // plan['devices']}, pipeline device {g % plan['devices']}) "
          f"| {peak['parts']['optimizer']:,} B | {a['predicted_peak_bytes']:,} B | {a['peak_bytes']:,} B | {b['peak_bytes']:,} B |")
PY
  grep -o '"loss":[^,}]*' "$work/$plan.mpi.json" | cut -d: -f2 | tr '\n' ' ' >"$work/$plan.loss"
done
echo
echo "losses under mpirun, unsharded: $(cat "$work/plain.loss")"
echo "losses under mpirun, sharded:   $(cat "$work/zero.loss")"
cmp -s "$work/plain.loss" "$work/zero.loss" && echo "(bit for bit the same)" || echo "(they differ)"
