// stagerun's held-out evaluation (stagerun_eval.h): the eval batches' forward, the mean loss.
#include "tools/stagerun_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/format/error.h"
#include "tools/json_formats.h"

namespace fs = std::filesystem;

namespace stagecraft::tools {

void add_eval_options(CLI::App& app, Args& args) {
  app.add_option("--eval-data", args.eval_data_dir,
                 "Held-out evaluation of a training read with --data or --tokens: DIR with "
                 "NAME.npy per graph input holding whole batches (as --data); the training "
                 "plan's forward and loss only, Dropout off, nothing of the training changed");
  app.add_option("--eval-tokens", args.eval_tokens_path,
                 "Held-out evaluation as --eval-data from a token stream FILE (as --tokens: "
                 "windows of --seq, in file order, never shuffled)");
  app.add_option("--eval-every", args.eval_every,
                 "Evaluate after every N optimizer steps (and after the last step; without it, "
                 "only after the last step)");
  app.add_option("--eval-batches", args.eval_batches,
                 "Batches per evaluation, the eval file's first K (default: all of them, at most "
                 "50); a file of fewer is refused");
}

void check_eval_args(const Args& args) {
  const bool data = !args.eval_data_dir.empty(), tokens = !args.eval_tokens_path.empty();
  if (data && tokens)
    fail(ErrorKind::kUsage, "--eval-data and --eval-tokens exclude each other; give one");
  if (args.eval_every && *args.eval_every < 1)
    fail(ErrorKind::kUsage, "--eval-every must be 1 or more, not {}", *args.eval_every);
  if (args.eval_batches && *args.eval_batches < 1)
    fail(ErrorKind::kUsage, "--eval-batches must be 1 or more, not {}", *args.eval_batches);
  if (!data && !tokens) {
    if (args.eval_every || args.eval_batches)
      fail(ErrorKind::kUsage,
           "--eval-every and --eval-batches need --eval-data DIR or --eval-tokens FILE");
    return;
  }
  const char* flag = data ? "--eval-data" : "--eval-tokens";
  if (args.data_dir.empty() && args.tokens_path.empty())
    fail(ErrorKind::kUsage,
         "{} evaluates a training read step by step: give its data with --data DIR or --tokens "
         "FILE",
         flag);
  if (args.steps < 1)
    fail(ErrorKind::kUsage, "{} evaluates after training steps; --steps is {}", flag, args.steps);
}

std::unique_ptr<Evaluator> Evaluator::make(const Args& args, const rt::Pipeline& pipeline,
                                           const rt::mpi::World* world) {
  const bool data = !args.eval_data_dir.empty();
  if (!data && args.eval_tokens_path.empty()) return nullptr;
  const std::string flag = data ? "--eval-data" : "--eval-tokens";
  const std::string& path = data ? args.eval_data_dir : args.eval_tokens_path;
  if (!pipeline.plan().training)
    fail(ErrorKind::kUsage, "{} evaluates a training plan's loss; {} is an inference plan", flag,
         args.plan_dir);
  std::unique_ptr<BatchSource> source;
  if (data) {
    if (!fs::is_directory(path)) fail(ErrorKind::kIo, "--eval-data {}: no such directory", path);
    source = data_batches(path, pipeline, "--eval-data");
  } else {
    // As --tokens reads its stream (--seq, --token-dtype), in file order.
    Args eval = args;
    eval.tokens_path = path;
    eval.shuffle = false;
    eval.seed = 0;
    std::string note;  // --tokens' run said it about the same vocabulary
    source = token_batches(eval, pipeline, note);
  }
  const int64_t held = source->batches();
  int64_t batches = std::min(held, kDefaultEvalBatches);
  if (args.eval_batches) {
    if (*args.eval_batches > held)
      fail(ErrorKind::kUsage, "--eval-batches {}: {} {} holds {} batch{} of the plan's batch",
           *args.eval_batches, flag, path, held, held == 1 ? "" : "es");
    batches = *args.eval_batches;
  }
  if (batches < 1)
    fail(ErrorKind::kUsage, "{} {} holds no whole batch of the plan's batch", flag, path);
  return std::unique_ptr<Evaluator>(new Evaluator(args, std::move(source), batches, world));
}

bool Evaluator::due(int64_t done, bool last) const {
  return last || (every_ > 0 && done % every_ == 0);
}

EvalResult Evaluator::run(rt::Pipeline& pipeline, const rt::RunOptions& training) {
  const auto start = std::chrono::steady_clock::now();
  rt::RunOptions options;
  options.steps = 1;
  options.forward_only = true;
  options.timeout_s = training.timeout_s;
  options.skip_nonfinite = skip_nonfinite_;
  options.trace_steps = 0;
  // Under mpirun: the training's transport to the other ranks and its step barrier (no stop
  // request is read here: one that comes now stops after the next training step).
  options.make_transport = training.make_transport;
  options.step_barrier = training.step_barrier;
  EvalResult result;
  result.step = pipeline.steps_done();
  result.batches = batches_;
  // Every replica normalises with the first replica's running statistics, as DDP's
  // broadcast_buffers gives every rank rank 0's (each replica wrote its own in training).
  if (world_)
    world_->share_running_statistics(pipeline);
  else
    pipeline.share_running_statistics();
  source_->rewind();
  std::vector<double> losses;  // per batch (a rank without the loss stage: NaN)
  for (int64_t k = 0; k < batches_; ++k) {
    const Batch batch = source_->next();
    const rt::RunReport report = pipeline.run(batch.inputs, options);
    if (report.losses.size() != 1)
      fail(ErrorKind::kInternal, "an evaluation's run gave {} losses, not 1", report.losses.size());
    losses.push_back(report.losses.front());
  }
  if (pipeline.steps_done() != result.step)
    fail(ErrorKind::kInternal, "an evaluation moved the step count from {} to {}", result.step,
         pipeline.steps_done());
  if (world_) {
    losses = world_->replica_losses(losses, pipeline.plan());
    if (world_->rank() != 0) return result;
  }
  double sum = 0;
  for (double loss : losses) sum += loss;
  result.loss = sum / static_cast<double>(batches_);
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (json_) {
    const nlohmann::ordered_json record = {{"type", "eval"},
                                           {"format_version", kRunJsonVersion},
                                           {"step", result.step},
                                           {"loss", result.loss},
                                           {"batches", result.batches},
                                           {"seconds", result.seconds}};
    fmt::print("{}\n", record.dump());
  } else {
    fmt::print(to_stderr_ ? stderr : stdout,
               "eval after step {}: loss {:.6f} over {} batch{} ({:.2f} s)\n", result.step,
               result.loss, result.batches, result.batches == 1 ? "" : "es", result.seconds);
  }
  std::fflush(to_stderr_ ? stderr : stdout);
  return result;
}

}  // namespace stagecraft::tools
