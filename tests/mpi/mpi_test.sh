#!/usr/bin/env bash
# The checks of tests/mpi (CMakeLists.txt names them), one per call:
#   transport  MPIRUN TEST_BINARY                      the transport's doctest cases on 2 ranks
#   train      MPIRUN STAGERUN STAGEC SAMPLES WORKDIR  2 ranks train as one process does
#   infer      ...                                     2 ranks infer the same outputs, bit for bit
#   world_size ...                                     3 ranks for a 2-device plan: every rank refuses
# Exit 77 (skipped) where there is no mpirun or the build has no MPI.
set -euo pipefail

check=$1 mpirun=${2:-}
if [ -z "$mpirun" ] || [ "$mpirun" = "MPIEXEC_EXECUTABLE-NOTFOUND" ] || ! command -v "$mpirun" >/dev/null; then
  echo "SKIP: no mpirun (Debian's openmpi-bin; tools/setup.sh installs it)"
  exit 77
fi
# CI runs as root on 2 cores.
mpi=("$mpirun" --oversubscribe --allow-run-as-root)

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

if [ "$check" = transport ]; then
  [ "$3" = none ] && { echo "SKIP: the build has no MPI"; exit 77; }
  exec "${mpi[@]}" -np 2 "$3"
fi

stagerun=$3 stagec=$4 samples=$5 work=$6
rm -rf "$work" && mkdir -p "$work" && cd "$work"

case "$check" in
  train)
    "$stagec" "$samples/mnist_cnn.onnx" -o plan --devices 2 --train --loss mse --batch 8 \
      --microbatches 4 >/dev/null
    "$stagerun" plan --steps 3 --json -q --backend cpu >one.json
    if ! "${mpi[@]}" -np 2 "$stagerun" plan --steps 3 --json -q >ranks.json 2>ranks.err; then
      cat ranks.err >&2
      fail "mpirun -np 2 stagerun failed"
    fi
    # Rank 0 alone prints, what one process prints (numbers aside: times differ).
    diff <(tr -d '0-9.e+-' <one.json) <(tr -d '0-9.e+-' <ranks.json) >/dev/null ||
      fail "rank 0 should print what one process prints; got: $(cat ranks.json)"
    grep -o '"loss":[^,]*' one.json | cut -d: -f2 >one.loss
    grep -o '"loss":[^,]*' ranks.json | cut -d: -f2 >ranks.loss
    [ "$(wc -l <ranks.loss)" -eq 3 ] || fail "expected 3 losses, got $(cat ranks.loss)"
    paste one.loss ranks.loss | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 || $2 != $2 + 0) bad = 1 }
      END { exit bad }' || fail "losses differ by more than 1e-6: $(paste one.loss ranks.loss)"
    if cmp -s one.loss ranks.loss; then echo "losses bit-identical: $(tr '\n' ' ' <ranks.loss)"; fi
    # The summary holds both devices' figures (gathered from rank 1).
    grep -q '"devices": *2,' ranks.json || fail "no 2-device summary"
    [ "$(grep -o '"peak_bytes": *[1-9]' ranks.json | wc -l)" -eq 2 ] ||
      fail "both devices' peak memory should be gathered: $(tail -1 ranks.json)"
    ;;
  infer)
    "$stagec" "$samples/mnist_cnn.onnx" -o plan --devices 2 --batch 8 --microbatches 4 >/dev/null
    "$stagerun" plan --outputs one -q >/dev/null
    "${mpi[@]}" -np 2 "$stagerun" plan --outputs ranks -q --json >ranks.json ||
      fail "mpirun -np 2 stagerun failed"
    for f in one/*.npy; do
      cmp "$f" "ranks/$(basename "$f")" || fail "$(basename "$f") differs from the one-process run"
    done
    [ "$(ls ranks | wc -l)" -eq "$(ls one | wc -l)" ] || fail "not the same output files"
    ;;
  world_size)
    "$stagec" "$samples/mnist_cnn.onnx" -o plan --devices 2 --batch 8 --microbatches 4 >/dev/null
    if "${mpi[@]}" -np 3 "$stagerun" plan -q >out.txt 2>err.txt; then
      fail "mpirun -np 3 ran a 2-device plan"
    fi
    n=$(grep -c 'mpirun started 3 ranks but the plan plan has 2 devices: run one rank per plan device (mpirun -np 2)' err.txt || true)
    [ "$n" -eq 3 ] || fail "every rank (3) should refuse with both numbers; $n did: $(cat err.txt)"
    [ ! -s out.txt ] || fail "a refused run printed: $(cat out.txt)"
    ;;
  *)
    fail "unknown check '$check'"
    ;;
esac
echo "ok: $check"
