#!/usr/bin/env bash
# stagerun --tokens reads a token stream a window at a time: a stream larger than the whole
# address space the process may have (ulimit -v) trains. The limit is what a run on a tiny
# stream needs (its VmPeak, measured here) plus 128 MiB; the stream is that limit plus 256 MiB
# (a sparse file of zeros, token 0), read in shuffled windows spread over all of it. A reader
# that read or mapped the whole file could not run under the limit.
#
#   tokens_memory_test.sh STAGEC STAGERUN SAMPLES_DIR WORK_DIR
set -euo pipefail
stagec=$1 stagerun=$2 samples=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
cd "$work"
# One arena per thread would make the address space depend on which threads met in malloc.
export MALLOC_ARENA_MAX=2
"$stagec" "$samples/gpt_tiny.onnx" -o plan --devices 2 --train --loss cross-entropy --batch 4 \
  --microbatches 2 --dim seq=8 --device-spec cpu >/dev/null
head -c 2000 /dev/zero >small.bin

# The peak address space of a run on the tiny stream: VmPeak read until the process ends.
"$stagerun" plan --tokens small.bin --steps 100 -q >/dev/null &
pid=$!
peak_kb=0
while kill -0 "$pid" 2>/dev/null; do
  kb=$(awk '/^VmPeak:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  [ -n "$kb" ] && [ "$kb" -gt "$peak_kb" ] && peak_kb=$kb
  sleep 0.02
done
wait "$pid"
[ "$peak_kb" -gt 0 ] || { echo "could not read the run's VmPeak"; exit 1; }
limit_kb=$((peak_kb + 128 * 1024))
stream_bytes=$(((limit_kb + 256 * 1024) * 1024))
truncate -s "$stream_bytes" big.bin
echo "VmPeak of a run on a 2000-byte stream: $((peak_kb / 1024)) MiB; ulimit -v $((limit_kb / 1024)) MiB;" \
  "stream $((stream_bytes / 1048576)) MiB"
(ulimit -v "$limit_kb" && exec "$stagerun" plan --tokens big.bin --steps 3 --shuffle --seed 1 --json -q) >big.json
grep -c '"type":"step"' big.json | grep -qx 3 || { echo "expected 3 step records"; cat big.json; exit 1; }
grep -q '"loss"' big.json
# The limit bites: one buffer of the whole stream (dd's) cannot be had under it.
if (ulimit -v "$limit_kb" && exec dd if=big.bin of=/dev/null bs="$stream_bytes" count=1) 2>/dev/null; then
  echo "reading the whole stream at once under ulimit -v $((limit_kb / 1024)) MiB did not fail"
  exit 1
fi
echo "ok: a $((stream_bytes / 1048576)) MiB stream trained under ulimit -v $((limit_kb / 1024)) MiB"
