#!/usr/bin/env bash
# stagerun's data read step by step under mpirun (issue 35), one check per call:
#   CHECK MPIRUN STAGERUN STAGEC LM_DATA SAMPLES WORKDIR, CHECK one of
#     eval         --eval-tokens and --eval-data under mpirun: every evaluation's loss is the
#                  one-process evaluation's of the same plan within 1e-6 (a pipeline of 2
#                  devices, 2 replicas of one device on 2 ranks, 2 x 2 on 4 ranks); the
#                  training's losses and its checkpoint are those of the run without
#                  --eval-every, bit for bit; rank 0 alone prints the eval lines; a refusal
#                  (--eval-batches past the file) is made by every rank alike
#     data_resume  a checkpoint saved under mpirun keeps the data's position: 3 steps, a save
#                  and 3 resumed steps give the 6 losses of 6 straight steps bit for bit, with
#                  --tokens --shuffle and with --data, on 2 ranks
#     bn_eval      BatchNormalizations that train (a ResNet exported in train mode): each rank's
#                  replica updates its own running statistics, and an evaluation normalises every
#                  replica's share with the first replica's (DDP's broadcast_buffers, broadcast
#                  between the ranks): its losses are the one-process run's within 1e-6 (2
#                  replicas on 2 ranks, pipelines of 2 devices as 2 replicas on 4 ranks)
#   (all but bn_eval's MAKE_SAMPLES, the 8th argument, are used by every check)
# Exit 77 (skipped) where there is no mpirun or the build has no MPI.
set -euo pipefail

check=$1 mpirun=${2:-}
if [ -z "$mpirun" ] || [ "$mpirun" = "MPIEXEC_EXECUTABLE-NOTFOUND" ] || ! command -v "$mpirun" >/dev/null; then
  echo "SKIP: no mpirun (Debian's openmpi-bin; tools/setup.sh installs it)"
  exit 77
fi
stagerun=$3 stagec=$4 lm_data=$5 samples=$6 work=$7 make_samples=${8:-}
# CI runs as root on 2 cores; CPU ranks even where a GPU is; a waiting rank yields its core.
mpi=("$mpirun" --oversubscribe --allow-run-as-root)
# hwloc's GL component (loaded by mpirun's and every rank's topology discovery) probes X
# displays, each probe a name lookup; without /etc/hosts (CI's fresh Debian root) the lookups
# went to a DNS server that dropped them, 5 s each: mpirun -np 4 of MPI_Init alone took 10.4 s
# there, 0.35 s with this, and the MPI tests ran 10-30x slower than here (stagerun sets it for
# its own ranks, not for mpirun).
export HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--gl}
export CUDA_VISIBLE_DEVICES= OMPI_MCA_mpi_yield_when_idle=1
rm -rf "$work" && mkdir -p "$work" && cd "$work"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
# ranks N ARGS...: `mpirun -np N stagerun ARGS...`, stdout to stdout; fails the check, showing
# the ranks' errors, when it fails.
ranks() {
  local n=$1
  shift
  timeout 100 "${mpi[@]}" -np "$n" "$stagerun" "$@" 2>ranks.err ||
    fail "mpirun -np $n stagerun $*: $(cat ranks.err)"
}
# The losses of a --json run's step records, and its eval records' losses, one per line, as
# printed (17 significant digits: equal text is equal bits).
step_losses() { grep '"type":"step"' "$1" | grep -o '"loss":[^,}]*' | cut -d: -f2; }
eval_losses() { grep '"type":"eval"' "$1" | grep -o '"loss":[^,}]*' | cut -d: -f2; }

# Byte-level token streams of two texts (the model's vocabulary holds every byte), and --data
# folders of the training text's windows.
sed -n 1,60p "$samples/../../README.md" >train.txt
sed -n 61,100p "$samples/../../README.md" >eval.txt
"$lm_data" --tokens-out train.bin --text train.txt >/dev/null
"$lm_data" --tokens-out eval.bin --text eval.txt >/dev/null
"$lm_data" --out data --text train.txt --batches 5 --batch 8 --seq 16 >/dev/null
"$lm_data" --out eval_data --text eval.txt --batches 3 --batch 8 --seq 16 --seed 2 >/dev/null
gpt=("$samples/gpt_tiny.onnx" --train --loss cross-entropy --batch 8 --dim seq=16 --optimizer adam
  --device-spec cpu)

case "$check" in
  eval)
    "$stagec" "${gpt[@]}" -o pipe --devices 2 --microbatches 4 >/dev/null
    "$stagec" "${gpt[@]}" -o replicas --devices 2 --data-parallel 2 --microbatches 2 >/dev/null
    "$stagec" "${gpt[@]}" -o both --devices 4 --data-parallel 2 --microbatches 2 >/dev/null
    # PLAN RANKS | training's data | evaluation's
    for run in "pipe 2|--tokens train.bin|--eval-tokens eval.bin --eval-batches 3" \
      "replicas 2|--tokens train.bin --shuffle|--eval-tokens eval.bin --eval-batches 4" \
      "both 4|--data data|--eval-data eval_data"; do
      IFS='|' read -r plan_ranks data_flags eval_flags <<<"$run"
      read -r plan n <<<"$plan_ranks"
      read -ra data_flags <<<"$data_flags"
      read -ra eval_flags <<<"$eval_flags"
      train=("$plan" --steps 4 --json -q "${data_flags[@]}")
      "$stagerun" "${train[@]}" "${eval_flags[@]}" --eval-every 2 >one.json 2>one.err ||
        fail "$plan: the one-process run failed: $(cat one.err)"
      ranks "$n" "${train[@]}" "${eval_flags[@]}" --eval-every 2 --checkpoint ck_eval >evaluated.json
      ranks "$n" "${train[@]}" --checkpoint ck_plain >plain.json
      eval_losses one.json >one.eval
      eval_losses evaluated.json >ranks.eval
      [ "$(wc -l <ranks.eval)" -eq 2 ] || fail "$plan: expected 2 eval records (after steps 2 and 4)," \
        "got: $(grep '"type":"eval"' evaluated.json)"
      grep '"type":"eval"' evaluated.json | grep -q '"step":2,.*"batches":[34],' ||
        fail "$plan: the first eval record is not after step 2: $(grep '"type":"eval"' evaluated.json)"
      paste one.eval ranks.eval | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 || $2 != $2 + 0) bad = 1 }
        END { exit bad }' || fail "$plan: eval losses differ from one process's by more than" \
        "1e-6: $(paste one.eval ranks.eval)"
      # The evaluations change nothing of the training: its losses and checkpoint.
      step_losses evaluated.json >evaluated.loss
      step_losses plain.json >plain.loss
      [ "$(wc -l <plain.loss)" -eq 4 ] || fail "$plan: expected 4 step losses: $(cat plain.loss)"
      cmp -s evaluated.loss plain.loss ||
        fail "$plan: the evaluations changed the training's losses: $(paste plain.loss evaluated.loss)"
      diff -r ck_eval ck_plain >/dev/null ||
        fail "$plan: the evaluations changed the checkpoint: $(diff -r ck_eval ck_plain | head -5)"
      rm -rf ck_eval ck_plain
      same="within 1e-6"
      cmp -s one.eval ranks.eval && same="bit for bit"
      echo "$plan on $n ranks: eval losses $(tr '\n' ' ' <ranks.eval)(one process's $same)"
    done
    # Text: one line per evaluation, printed by rank 0 alone.
    ranks 2 pipe --steps 2 -q --tokens train.bin --eval-tokens eval.bin --eval-every 1 \
      --eval-batches 2 >text.out
    [ "$(grep -cE '^eval after step [12]: loss [0-9]+\.[0-9]{6} over 2 batches \(' text.out)" -eq 2 ] ||
      fail "expected 2 eval lines from rank 0 alone: $(cat text.out)"
    # A refusal that still applies: every rank makes it alike and ends normally, no MPI_Abort.
    if "${mpi[@]}" -np 2 "$stagerun" pipe --steps 2 -q --tokens train.bin --eval-tokens eval.bin \
      --eval-batches 999 >out.txt 2>err.txt; then
      fail "--eval-batches 999 of a short file was not refused"
    fi
    [ "$(grep -c '^stagerun: usage error: --eval-batches 999: --eval-tokens eval.bin holds [0-9]* batches' err.txt)" -eq 2 ] ||
      fail "--eval-batches 999: expected the refusal from both ranks: $(cat err.txt)"
    if grep -q MPI_Abort err.txt; then fail "--eval-batches 999 ended the ranks with MPI_Abort"; fi
    ;;
  data_resume)
    "$stagec" "${gpt[@]}" -o pipe --devices 2 --microbatches 4 >/dev/null
    for source in "--tokens train.bin --shuffle --seed 3" "--data data"; do
      read -ra flags <<<"$source"
      ranks 2 pipe --steps 6 --json -q "${flags[@]}" >straight.json
      ranks 2 pipe --steps 3 --json -q "${flags[@]}" --checkpoint ck >first.json
      grep -q '"data": {' ck/manifest.json ||
        fail "$source: the checkpoint saved under mpirun has no data position (ck/manifest.json \"data\")"
      ranks 2 pipe --steps 3 --json -q "${flags[@]}" --resume ck >resumed.json
      step_losses straight.json >straight.loss
      { step_losses first.json; step_losses resumed.json; } >resumed.loss
      [ "$(wc -l <straight.loss)" -eq 6 ] || fail "$source: expected 6 losses: $(cat straight.loss)"
      cmp -s straight.loss resumed.loss ||
        fail "$source: 3 + 3 resumed steps are not the 6 straight steps:" \
          "$(paste straight.loss resumed.loss)"
      # A resume that started the data over would repeat the first steps' batches.
      cmp -s <(sed -n 1,3p straight.loss) <(sed -n 4,6p straight.loss) &&
        fail "$source: steps 4-6 repeat steps 1-3; the check could not tell a restart"
      rm -rf ck
      echo "$source: 3 + 3 resumed on 2 ranks = 6 straight, bit for bit: $(tr '\n' ' ' <straight.loss)"
    done
    ;;
  bn_eval)
    [ -x "$make_samples" ] || fail "bn_eval needs stagecraft-make-samples (argument 8)"
    "$make_samples" resnet -o bn.onnx --train-bn --widths 4 8 --blocks 1 --image-size 8 \
      --classes 5 >/dev/null
    # --data folders: images x [rows,3,8,8] and targets labels [rows,5] (the MSE loss's), each
    # the graph output of a small model of the same shape on stagerun's synthetic inputs
    # (a U-Net with 3 classes, the toy MLP with 5 outputs), other seeds for the held-out set.
    # DIR ROWS SEED
    images_and_targets() {
      local dir=$1 rows=$2 seed=$3
      "$make_samples" unet -o "$dir.img.onnx" --in-channels 2 --width 4 --image-size 8 \
        --classes 3 --seed "$seed" >/dev/null
      "$make_samples" toy -o "$dir.tgt.onnx" --seed "$((seed + 1))" >/dev/null
      for part in img tgt; do
        "$stagec" "$dir.$part.onnx" --batch "$rows" --device-spec cpu -o "$dir.$part.plan" >/dev/null
        "$stagerun" "$dir.$part.plan" -q --outputs "$dir.$part.out" >/dev/null
        [ "$(ls "$dir.$part.out" | wc -l)" -eq 1 ] ||
          fail "expected one graph output of $dir.$part.onnx: $(ls "$dir.$part.out")"
      done
      mkdir -p "$dir"
      mv "$dir".img.out/*.npy "$dir/x.npy"
      mv "$dir".tgt.out/*.npy "$dir/labels.npy"
    }
    images_and_targets bn_data 32 11
    images_and_targets bn_eval_data 16 21
    bn=(bn.onnx --train --loss mse --batch 8 --optimizer adam --device-spec cpu)
    "$stagec" "${bn[@]}" -o replicas --devices 2 --data-parallel 2 --microbatches 2 >/dev/null
    "$stagec" "${bn[@]}" -o both --devices 4 --data-parallel 2 --microbatches 2 >/dev/null
    grep -q '"data_parallel": 2' replicas/plan.json || fail "the replicas plan is not data-parallel"
    for plan_ranks in "replicas 2" "both 4"; do
      read -r plan n <<<"$plan_ranks"
      run=("$plan" --steps 4 --json -q --data bn_data --eval-data bn_eval_data --eval-every 2)
      "$stagerun" "${run[@]}" >one.json 2>one.err ||
        fail "$plan: the one-process run failed: $(cat one.err)"
      ranks "$n" "${run[@]}" >ranks.json
      eval_losses one.json >one.eval
      eval_losses ranks.json >ranks.eval
      [ "$(wc -l <ranks.eval)" -eq 2 ] ||
        fail "$plan: expected 2 eval records: $(grep '"type":"eval"' ranks.json)"
      paste one.eval ranks.eval | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 || $2 != $2 + 0) bad = 1 }
        END { exit bad }' || fail "$plan: eval losses on $n ranks differ from one process's by" \
        "more than 1e-6 (each replica normalised with its own statistics?): $(paste one.eval ranks.eval)"
      step_losses one.json >one.loss
      step_losses ranks.json >ranks.loss
      paste one.loss ranks.loss | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6) bad = 1 }
        END { exit bad }' || fail "$plan: step losses differ: $(paste one.loss ranks.loss)"
      echo "$plan on $n ranks: eval losses $(tr '\n' ' ' <ranks.eval)(one process's within 1e-6)"
    done
    ;;
  *)
    fail "unknown check '$check'"
    ;;
esac
