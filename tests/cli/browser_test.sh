#!/usr/bin/env bash
# browser_test.sh STAGEC STAGEDUMP STAGERUN SAMPLES WORKDIR: stagedump's HTML page in headless
# Chromium (Debian's chromium; tools/setup.sh --test installs it). For a zb-h1 plan of 3 devices
# with a measured run (stagerun --trace) and an interleaved one (2 devices x 2 chunks) with a
# stagerun --json run (and the zb plan again with both its trace and a --json run, drawn at once),
# the page loads without console errors, its script's marker says it drew
# one box per instruction of schedule.json (the boxes are in the DOM too) and that the page is not
# wider than a 480-pixel window, and a screenshot at 1280 pixels is kept in WORKDIR (the test's
# build folder) as an artifact. Exit 77 (skipped) where there is no chromium.
set -euo pipefail
stagec=$1 stagedump=$2 stagerun=$3 samples=$4 work=$5

browser=""
for candidate in chromium chromium-browser; do
  if command -v "$candidate" >/dev/null; then browser=$candidate; break; fi
done
if [ -z "$browser" ]; then
  echo "SKIP: no chromium (Debian's chromium; tools/setup.sh --test installs it)"
  exit 77
fi

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Headless, no GPU, no sandbox (CI runs as root); console messages on stderr.
headless() {
  "$browser" --headless --disable-gpu --no-sandbox --no-first-run --hide-scrollbars \
    --user-data-dir="$work/profile" --enable-logging=stderr --v=0 "$@"
}

rm -rf "$work" && mkdir -p "$work"
# A browser that cannot start here (no /dev/shm in a bare chroot, ...) is this machine's
# limit, not the page's: skipped, saying why.
if ! headless --dump-dom 'data:text/html,<p>started</p>' 2>"$work/probe.txt" | grep -q started; then
  echo "SKIP: $browser does not start headless here:"
  grep -v dbus "$work/probe.txt" | tail -5
  exit 77
fi
gpt="$samples/gpt_tiny.onnx --train --loss cross-entropy --batch 8 --dim seq=16 --device-spec cpu"

check_page() {  # NAME PLAN_DIR RUN [RUN]
  local name=$1 plan=$2
  shift 2
  local page="$work/$name.html" measured=()
  for run in "$@"; do measured+=(--measured "$run"); done
  "$stagedump" "$plan" --html "$page" "${measured[@]}" >/dev/null
  headless --window-size=480,900 --virtual-time-budget=2000 --dump-dom "file://$page" \
    >"$work/$name.dom.html" 2>"$work/$name.console.txt" || fail "$name: chromium exited $?"
  headless --window-size=1280,1600 --screenshot="$work/$name.png" "file://$page" \
    >/dev/null 2>>"$work/$name.console.txt" || fail "$name: chromium --screenshot exited $?"
  [ -s "$work/$name.png" ] || fail "$name: no screenshot"
  # Console messages of the page ("CONSOLE" lines: errors, uncaught exceptions, logs).
  if grep -E "CONSOLE|Uncaught" "$work/$name.console.txt"; then
    fail "$name: the page wrote to the console (above; $work/$name.console.txt)"
  fi
  local instructions marker boxes
  instructions=$(grep -o '"op"' "$plan/schedule.json" | wc -l)
  marker=$(grep -o '<p id="stagedump-drawn"[^>]*>' "$work/$name.dom.html") ||
    fail "$name: no marker in the DOM: the page's script did not run ($work/$name.dom.html)"
  boxes=$(grep -o '<rect class="instr"' "$work/$name.dom.html" | wc -l)
  echo "$name: schedule.json $instructions instructions; DOM $boxes boxes; $marker"
  [ "$instructions" -gt 0 ] || fail "$name: no instructions in $plan/schedule.json"
  [ "$boxes" -eq "$instructions" ] || fail "$name: $boxes boxes for $instructions instructions"
  grep -q "data-instructions=\"$instructions\"" <<<"$marker" ||
    fail "$name: the script counted other boxes: $marker"
  grep -q 'data-overflow="no"' <<<"$marker" || fail "$name: wider than a 480-pixel window"
}

"$stagec" $gpt --devices 3 --microbatches 4 --schedule zb-h1 -o "$work/zb" >/dev/null
"$stagerun" "$work/zb" --steps 3 -q --trace "$work/zb.trace.json" >/dev/null
check_page zb "$work/zb" "$work/zb.trace.json"
grep -q 'data-measured="[1-9]' "$work/zb.dom.html" || fail "zb: no measured boxes"
# Each device's memory over the step, on the timeline's axis: predicted, and the trace's counter.
[ "$(grep -o 'class="memory-lane"' "$work/zb.dom.html" | wc -l)" -eq 3 ] || fail "zb: not 3 memory lanes"
grep -q 'class="memory-measured"' "$work/zb.dom.html" || fail "zb: no measured memory curve"
# Both records of one plan at once: the trace's boxes and the --json run's device peaks.
"$stagerun" "$work/zb" --steps 3 -q --json >"$work/zb.run.jsonl"
check_page zb-both "$work/zb" "$work/zb.trace.json" "$work/zb.run.jsonl"
grep -q 'data-measured="[1-9]' "$work/zb-both.dom.html" || fail "zb-both: no measured boxes"
grep -q 'class="measured-peak"' "$work/zb-both.dom.html" || fail "zb-both: no measured peaks"
grep -q 'class="byte-axis"' "$work/zb-both.dom.html" || fail "zb-both: no byte scale under the bars"

"$stagec" $gpt --devices 2 --microbatches 4 --schedule interleaved -o "$work/interleaved" >/dev/null
"$stagerun" "$work/interleaved" --steps 2 -q --json >"$work/interleaved.run.jsonl"
check_page interleaved "$work/interleaved" "$work/interleaved.run.jsonl"
grep -q 'class="measured-peak"' "$work/interleaved.dom.html" || fail "interleaved: no measured peaks"
rm -rf "$work/profile"
echo "ok: screenshots in $work"
