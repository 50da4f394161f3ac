#pragma once
/// \file
/// stagerun's held-out evaluation of a training run read step by step (--data, --tokens):
///
///   --eval-data DIR     NAME.npy per graph input holding whole batches, as --data reads them
///   --eval-tokens FILE  a token stream, as --tokens reads it: windows of the training's --seq
///                       (and --token-dtype for a raw file), in file order, never shuffled
///   --eval-every N      evaluate after every N optimizer steps (counted as the step records
///                       count, so after --resume too); always after the run's last step; without
///                       it, only after the last step
///   --eval-batches K    the batches of each evaluation: the file's first K (default: all its
///                       batches, at most kDefaultEvalBatches); a file with fewer than K is
///                       refused before the training starts, naming the file and both numbers
///
/// An evaluation runs the training plan's forward only (rt::RunOptions::forward_only: no
/// backward, gradient, all-reduce or optimizer step; every Dropout the identity, as torch's
/// model.eval()) over the same K batches each time, from the first, and reports the mean of
/// their losses (each the mean over its microbatches and replicas, as a training step's). It
/// changes nothing of the training: weights, optimizer state, step count, lr schedule, loss
/// scale, the training's random draws and its data position. A BatchNormalization exported in
/// training mode normalises with its running statistics, as torch's model.eval() (the training
/// keeps them up to date; the evaluation does not update them).
///
/// Printed: one line per evaluation, `eval after step 20: loss 3.456789 over 8 batches (0.42 s)`;
/// with --json a record {type: "eval", format_version, step, loss, batches, seconds} as it happens
/// (docs/schemas/stagerun.schema.json). A stop signal ends the run after the step in flight with
/// no evaluation after it (one during an evaluation: after the next step, as between steps).
///
/// Under mpirun every rank reads the eval batches and runs its device's forward part of each,
/// through the training's transport and step barrier; the batches' losses go to rank 0
/// (rt::mpi::World::replica_losses), which combines the replicas' as a training step's loss is
/// combined and alone prints: the loss of one process's evaluation of the plan.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <utility>

#include "runtime/exec/pipeline.h"
#include "runtime/mpi/world.h"
#include "tools/stagerun_args.h"
#include "tools/stagerun_data.h"

namespace stagecraft::tools {

/// --eval-batches' default: every batch of the file, at most this many.
inline constexpr int64_t kDefaultEvalBatches = 50;

/// Declares --eval-data, --eval-tokens, --eval-every and --eval-batches on `app`.
void add_eval_options(CLI::App& app, Args& args);

/// The checks of the evaluation flags among themselves and with the others (before the plan is
/// read): one line, `Error(kUsage)`.
void check_eval_args(const Args& args);

/// What one evaluation gave.
struct EvalResult {
  int64_t step = 0;      ///< Optimizer steps done when it ran.
  double loss = 0;       ///< Mean over the batches.
  int64_t batches = 0;
  double seconds = 0;
};

/// The held-out batches of --eval-data or --eval-tokens and when to evaluate.
class Evaluator {
 public:
  /// Null without --eval-data or --eval-tokens. Refuses (one line) an inference plan, and a
  /// file of fewer batches than --eval-batches. `world`: this rank's launch under mpirun (null
  /// in one process).
  static std::unique_ptr<Evaluator> make(const Args& args, const rt::Pipeline& pipeline,
                                         const rt::mpi::World* world = nullptr);

  /// Whether an evaluation follows the step that brought the optimizer steps to `done`
  /// (`last`: the run's last step).
  bool due(int64_t done, bool last) const;

  /// Evaluates `pipeline` as it stands and prints the line or the JSON record (under mpirun:
  /// rank 0, whose result alone holds the loss). `training`: the training's run options, whose
  /// timeout, transport (mpirun) and step barrier the evaluation's runs take, and nothing else.
  EvalResult run(rt::Pipeline& pipeline, const rt::RunOptions& training);

  int64_t batches() const { return batches_; }

 private:
  Evaluator(const Args& args, std::unique_ptr<BatchSource> source, int64_t batches,
            const rt::mpi::World* world)
      : source_(std::move(source)),
        world_(world),
        batches_(batches),
        every_(args.eval_every.value_or(0)),
        json_(args.json),
        skip_nonfinite_(args.skip_nonfinite),
        to_stderr_(args.trace_path == "-") {}
  std::unique_ptr<BatchSource> source_;
  const rt::mpi::World* world_ = nullptr;  ///< Under mpirun; null in one process.
  int64_t batches_ = 0;
  int64_t every_ = 0;  ///< 0: after the last step only.
  bool json_ = false, skip_nonfinite_ = false;
  bool to_stderr_ = false;  ///< --trace - holds stdout.
};

}  // namespace stagecraft::tools
