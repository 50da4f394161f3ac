#!/bin/sh
# The calibration loop end to end on a bundled sample, 2 devices: stagec --profile cpu, stagerun
# --trace, stagec --calibrate, stagec again. The calibrated plan must predict the median step of
# the trace it was calibrated from within 5% (or closer than the uncalibrated prediction): a
# function of that one trace, so a loaded machine cannot fail it by timing a second run (with
# ACCURACY=1, up to three traces: see the end).
# stagedump --json must carry the plan's instruction costs, and a plan with other cuts
# (--split-after) must give each stage its own ops' factors.
# Usage: [ACCURACY=1] [STEPS=N] calibration_loop_test.sh STAGEC STAGERUN CHECK MODEL [STAGEC OPTIONS...]
# (CHECK: stagecraft-calibration-check, tests/profile/calibration_check.cpp, which reads the plans.)
# Without ACCURACY=1 the accuracy is printed, not asserted (a model whose step is a few dozen
# microseconds, such as toy, is timed at the scheduler's grain on a loaded machine).
set -eu
stagec=$1 stagerun=$2 check=$3 model=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$stagec" "$model" -o "$work/before" --devices 2 "$@" --profile cpu --profile-db "$work/db.json" >"$work/before.txt"
grep -q "instruction costs (profiled" "$work/before.txt" || { cat "$work/before.txt"; echo "FAIL: no profiled instruction costs in stagec's summary"; exit 1; }
"$stagerun" "$work/before" --steps "${STEPS:-6}" --trace "$work/trace.json" -q >"$work/run.txt"
"$stagec" "$work/before" --calibrate "$work/trace.json" --profile-db "$work/db.json"
"$stagec" "$model" -o "$work/after" --devices 2 "$@" --profile cpu --profile-db "$work/db.json" >"$work/after.txt"
grep "calibrated from" "$work/after.txt" || { cat "$work/after.txt"; echo "FAIL: the second plan is not calibrated"; exit 1; }
"$(dirname "$stagec")/stagedump" "$work/after" | grep -q "calibrated from .*trace.json" ||
  { echo "FAIL: stagedump does not show the calibration"; exit 1; }
grep -q "the factors follow the ops: " "$work/after.txt" ||
  { cat "$work/after.txt"; echo "FAIL: the calibrated plan's factors do not follow its ops"; exit 1; }
"$(dirname "$stagec")/stagedump" "$work/after" --json >"$work/after-dump.json"
# The same calibration on other cuts: the first listed node the calibrated plan does not cut
# after (plan.json lists its predicted split_after first), and not the last node.
cut=$(grep -A1 '"split_after"' "$work/after/plan.json" | sed -n '2{s/[ ",]//g;p;}')
moved=$("$stagec" "$model" "$@" --list-nodes | awk -v cut="$cut" '{ names[NR] = $1 }
  END { for (i = 1; i < NR; ++i) if (names[i] != cut) { print names[i]; exit } }')
"$stagec" "$model" -o "$work/moved" --devices 2 "$@" --split-after "$moved" --profile cpu \
  --profile-db "$work/db.json" >"$work/moved.txt"
# A trace of another plan is refused in one line naming the file.
"$stagec" "$model" -o "$work/other" --devices 1 "$@" --profile cpu --profile-db "$work/db.json" >/dev/null
if "$stagec" "$work/other" --calibrate "$work/trace.json" --profile-db "$work/db.json" 2>"$work/refused.txt"; then
  echo "FAIL: a trace of another plan was accepted"; exit 1
fi
grep -q "trace.json" "$work/refused.txt" || { cat "$work/refused.txt"; echo "FAIL: the refusal does not name the trace"; exit 1; }
# So is a plan costed by the roofline (no measured times to calibrate).
"$stagec" "$model" -o "$work/roofline" --devices 2 "$@" --device-spec cpu >/dev/null
if "$stagec" "$work/roofline" --calibrate "$work/trace.json" --profile-db "$work/db.json" 2>"$work/refused.txt"; then
  echo "FAIL: a roofline plan was calibrated"; exit 1
fi
grep -q "calibration applies to plans made with --profile cpu" "$work/refused.txt" ||
  { cat "$work/refused.txt"; echo "FAIL: the roofline refusal does not say why"; exit 1; }
# The accuracy is of one trace, and this 2-core VM runs a pipeline of sub-millisecond steps in
# two modes (a worker waking in tens or in hundreds of microseconds, a whole run in one mode):
# a trace taken in the slow mode is fitted worse than the profile alone predicts it about one
# time in five under load (mnist_cnn, 2026-12-01, after its kernels got faster). With ACCURACY=1
# a failed accuracy check traces, calibrates and plans again, up to 3 times in all; a
# calibration that is wrong misses all three.
attempt=1
until "$check" "$work/before/plan.json" "$work/after/plan.json" "${ACCURACY:-0}" \
  "$work/after-dump.json" "$work/moved/plan.json"; do
  [ "${ACCURACY:-0}" = 1 ] && [ "$attempt" -lt 3 ] || exit 1
  attempt=$((attempt + 1))
  echo "accuracy check failed; trace, calibration and plan again (attempt $attempt of 3)"
  "$stagerun" "$work/before" --steps "${STEPS:-6}" --trace "$work/trace.json" -q >"$work/run.txt"
  "$stagec" "$work/before" --calibrate "$work/trace.json" --profile-db "$work/db.json" >/dev/null
  "$stagec" "$model" -o "$work/after" --devices 2 "$@" --profile cpu --profile-db "$work/db.json" \
    >"$work/after.txt"
  "$(dirname "$stagec")/stagedump" "$work/after" --json >"$work/after-dump.json"
  "$stagec" "$model" -o "$work/moved" --devices 2 "$@" --split-after "$moved" --profile cpu \
    --profile-db "$work/db.json" >"$work/moved.txt"
done
