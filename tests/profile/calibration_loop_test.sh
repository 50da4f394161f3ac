#!/bin/sh
# The calibration loop end to end on a bundled sample, 2 devices: stagec --profile cpu, stagerun
# --trace, stagec --calibrate, stagec again. The calibrated plan must predict the median step of
# the trace it was calibrated from within 5% (or closer than the uncalibrated prediction): a
# function of that one trace, so a loaded machine cannot fail it by timing a second run.
# Usage: [ACCURACY=1] [STEPS=N] calibration_loop_test.sh STAGEC STAGERUN MODEL [STAGEC OPTIONS...]
# Without ACCURACY=1 the accuracy is printed, not asserted (a model whose step is a few dozen
# microseconds, such as toy, is timed at the scheduler's grain on a loaded machine).
set -eu
stagec=$1 stagerun=$2 model=$3
shift 3
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
python3 - "$work/before/plan.json" "$work/after/plan.json" "${ACCURACY:-0}" <<'PY'
import json, sys
before, after = (json.load(open(p)) for p in sys.argv[1:3])
check = sys.argv[3] == "1"
c = after["instruction_costs"]
assert c["source"] == "calibration", c
assert before["instruction_costs"]["source"] == "profile", before["instruction_costs"]
measured, calibrated, uncalibrated = c["measured_step_ms"], after["predicted"]["step_ms"], c["uncalibrated_step_ms"]
print(f"trace median step {measured:.3f} ms; predicted before {before['predicted']['step_ms']:.3f} ms, "
      f"calibrated {calibrated:.3f} ms (uncalibrated, same split {uncalibrated:.3f} ms)")
error, before_error = abs(calibrated - measured), abs(uncalibrated - measured)
if check and error > max(0.05 * measured, before_error):
    sys.exit(f"FAIL: calibrated prediction {calibrated:.3f} ms is {100 * error / measured:.1f}% off "
             f"the measured {measured:.3f} ms (uncalibrated {100 * before_error / measured:.1f}%)")
print("PASS")
PY
