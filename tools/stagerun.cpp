// stagerun: execute a plan directory with microbatch pipelining.
//
//   stagerun PLAN_DIR [--backend auto|cpu|cuda] [--steps N] [--inputs FILE.npy|DIR] [--synthetic]
//            [--data DIR | --tokens FILE [--seq T] [--token-dtype uint16|uint32] [--shuffle --seed
//            S]]
//            [--outputs DIR] [--threads-per-device T] [--trace FILE [--trace-steps N]] [--json]
//            [--eval-data DIR | --eval-tokens FILE [--eval-every N] [--eval-batches K]]
//            [--checkpoint DIR [--save-every K]] [--resume DIR] [--export FILE.onnx]
//            [--timeout SECONDS] [--bucket-mb MIB] [--no-overlap] [--transport auto|nccl|mpi]
//            [--loss-scale S] [--loss-scale-window N]
//
// One worker thread per device runs the device's instruction stream from schedule.json; stages
// exchange tensors through bounded in-process channels. Inputs are the whole batch: stagerun
// cuts them into the plan's microbatches along the first axis (an input shaped like one
// microbatch is given to every microbatch). Without --inputs, deterministic synthetic data is
// used. Outputs (--outputs DIR) are the last step's graph outputs, DIR/NAME.npy each, the
// microbatches joined along the first axis.
//
// Training data read step by step (tools/stagerun_data.h): --data DIR (K batches per NAME.npy,
// step s trains on batch s mod K, each read when needed) and --tokens FILE (windows of T+1
// tokens of a language model's token stream, tools/token_stream.h), the next batch read on a
// thread of its own while a step runs; checkpoints keep the data's position ("data"; under
// mpirun rank 0 writes it), so --resume goes on with the batch after the checkpoint's.
// --eval-data DIR / --eval-tokens FILE [--eval-every N] [--eval-batches K] evaluate the training
// plan's forward on held-out batches between the steps, changing nothing of the training, in one
// process and under mpirun (tools/stagerun_eval.h).
//
// --json: JSON Lines (docs/schemas/stagerun.schema.json; times in ms, memory in bytes). One
// record per step, {type: "step", format_version, step, step_ms, [loss] (training), [epoch]
// (--tokens: the passes over the stream before the step's batch), [loss_scale,
// skipped] (training a precision fp16 plan), [grad_norm] (a plan that clips gradients)}, then one
//   {type: "summary", format_version, plan, backend, [backend_auto], threads_per_device,
//   [deterministic], spin_us, devices
//   (every replica's), data_parallel, microbatches (per replica), schedule, batch (global), steps,
//    inputs,
//    step_ms [every step], median_step_ms, median_of_steps, warmup_step_ms,
//    median_excludes_warmup, samples_per_s,
//    bubble {measured, predicted}, predicted_step_ms, cost_model, [final_loss] (training),
//    [loss_scale {scale, skipped_steps}] (training a precision fp16 plan),
//    plan_device {name, kind},
//    warnings [one line each: a plan costed for another kind of device, plan devices sharing a
//              GPU],
//    device [{device, busy_fraction, send_ms (the step's sends), peak_bytes,
//             predicted_peak_bytes, arena_bytes, weight_bytes,
//             [device_peak_bytes, device_used_bytes] (CUDA: the GPU's pool peak and in use),
//             [host_waits, host_wait_ms] (CUDA: the step's stream synchronisations, and the
//             time the host was blocked in them),
//             [allreduce_ms] (data parallelism: the step's time waiting in ALLREDUCE)}],
//    process_peak_rss_bytes,
//    outputs [{name, dtype, shape, file}]}
// The measured figures describe the median step, the first step (the warm-up) left out when
// there are others. A plan costed for another kind of device than the backend (an h100 plan on
// the cpu backend) gets a one-line warning on stderr naming the stagec flags that fix it; plan
// devices that share a GPU the plan did not share (stagec --devices-per-processor), one naming
// the predicted step that no longer holds (and the converse). A mixed-precision
// plan gets none: its stage files are bfloat16 (passes/mixed_precision.cpp) and every backend
// runs them so, kernels without a 16-bit path widened to float32 inside (Backend::runs_widened).
// --trace writes a Chrome trace of what ran (under mpirun rank 0 writes every rank's, each moved
// to rank 0's clock at every step's start), in the format of `stagedump --trace` (a process per
// device, "measured / device N", with a slice per step, the compute, the receives' waits and the
// sends, and the device's metered bytes after every instruction as a counter), every step;
// `stagedump PLAN --trace OUT --measured FILE` sets it beside the prediction. Only the first
// --trace-steps steps (default 100) are traced, and nothing is kept per instruction without
// --trace: a long run's memory stays flat (the per-step figures are a few numbers a step).
//
// SIGTERM, SIGINT or SIGUSR1 (tools/stagerun_stop.h) stops a run after the step in flight:
// every device finishes it (under mpirun every rank agrees on the step at the step barrier),
// --checkpoint saves, the figures of the steps run are printed (--json: a record {type:
// "stopped", signal, after_step, checkpoint} before the summary), one line says
// `stagerun: stopped by SIGTERM after step 1234; checkpoint ckpt holds it`, and the exit status
// is 75 (--export is not written). --resume then goes on bit for bit. A second signal stops at
// once.
//
// --bucket-mb (default 25, as PyTorch DDP's bucket_cap_mb): with data parallelism, a stage's
// gradients are summed over the replicas in buckets of at most this many MiB (whole weights),
// each started as soon as the stage's last backward of the step has computed its gradients, so
// the sums run while the backward goes on; ALLREDUCE waits for them, and the all-reduce time
// reported is that wait. --no-overlap starts them all at ALLREDUCE instead (for comparison).
//
// --spin-us N (default 0): how long a waiting device's worker watches for a message or the step
// barrier before it sleeps (runtime/exec/spin_condition.h); for workers with a core each. A
// waiter that finds its core shared (a yield that ran another thread) sleeps at once.
//
// --timeout (default 60 s; 0: none): how long a device waits for another (a message, a shared
// sum, under mpirun another rank at a step barrier) before the run stops with one line naming
// the instruction and the device or rank that stayed silent.
//
// Training: --checkpoint DIR saves weights, optimizer state and the step count every K steps
// (--save-every) and after the last step, atomically (runtime/exec/checkpoint.h); --resume DIR
// restores them before the run, on any training plan of the same model and optimizer (weights
// found by name: other devices, cuts, schedule, replicas; refusing another model or optimizer,
// runtime/exec/checkpoint.h); --export FILE writes the
// original model with the trained weights after the run (--steps 0: export without running).
// Under mpirun --checkpoint and --resume work too (one writer per stage, the manifest by rank 0:
// runtime/mpi/world.h), and --export (the ranks save a checkpoint beside FILE, rank 0 exports
// from it and removes it). GPU ranks (--backend cuda, or auto where a GPU is visible): each
// takes GPU (local rank modulo the GPUs it sees) and prints one line naming it and the
// transport: NCCL, or MPI through host memory where NCCL cannot be used (no NCCL, two ranks on
// one GPU) or --transport mpi asks for it (runtime/mpi/gpu_transport.h).
// A plan of precision fp16 trains with dynamic loss scaling from --loss-scale S (default 2^16),
// halved by a skipped step, doubled after --loss-scale-window N clean steps (runtime/exec/
// run_types.h LossScale); one process only (not under mpirun yet).
#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <thread>
#include <nlohmann/json.hpp>

#include "runtime/core/shared_processors.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "runtime/mpi/world.h"
#include "tools/dump/render.h"
#include "tools/cli_common.h"
#include "tools/stagerun_inputs.h"
#include "tools/stagerun_args.h"
#include "tools/stagerun_data.h"
#include "tools/stagerun_eval.h"
#include "tools/stagerun_notes.h"
#include "tools/stagerun_print.h"
#include "tools/stagerun_profile.h"
#include "tools/stagerun_stop.h"

namespace fs = std::filesystem;
using namespace stagecraft;
using tools::Args;
using tools::read_inputs;
using tools::prediction_gap;
using tools::report_loads;
using tools::print_json;
using tools::print_text;
using tools::write_outputs;
using tools::write_trace;

namespace {

// Declares every option of `args` on `app`.
void add_options(CLI::App& app, Args& args) {
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.add_option("PLAN_DIR", args.plan_dir, "Plan directory written by stagec")->required();
  app.add_option("--backend", args.backend_name,
                 "Backend: auto (cuda where a GPU is visible, else cpu; says which), cpu or cuda")
      ->capture_default_str();
  app.add_option("--transport", args.transport,
                 "Under mpirun with GPU ranks: auto (NCCL where every rank can use it and no two "
                 "share a GPU, else MPI through host memory; each rank says which), nccl or mpi")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}));
  app.add_option("--steps", args.steps,
                 "Steps to run over the same batch; figures are of the median step after the "
                 "first (warm-up) step")
      ->capture_default_str();
  app.add_option("--inputs", args.inputs_path,
                 "The whole batch: FILE.npy (one-input models) or DIR with NAME.npy or NAME.pb "
                 "per graph input");
  app.add_option(
      "--data", args.data_dir,
      "DIR with NAME.npy per graph input holding K whole batches along the first axis; step s "
      "trains on batch s mod K, read from the files a batch at a time (the next while a step "
      "runs); --resume goes on with the batch after the checkpoint's");
  app.add_option("--tokens", args.tokens_path,
                 "Training a language model: a token stream FILE (a 1-D .npy of uint16, uint32, "
                 "int32 or int64; llm.c's .bin with its header; else raw tokens, nanoGPT's "
                 "train.bin); each step's batch is windows of T+1 tokens, the tokens to the "
                 "model's integer input and the same shifted by one to the loss's labels");
  app.add_option("--seq", args.seq,
                 "--tokens: T, the tokens of a row (must be the plan's sequence length; default "
                 "the plan's)")
      ->check(cli::at_least<int64_t>(1));
  app.add_option("--token-dtype", args.token_dtype,
                 "--tokens of a raw file: its tokens' type (default uint16); a .npy or llm.c "
                 "file says its own")
      ->check(CLI::IsMember({"uint16", "uint32"}));
  app.add_flag("--shuffle", args.shuffle,
               "--tokens: draw the windows in a seeded order each epoch (every window once per "
               "epoch) instead of file order");
  app.add_option("--seed", args.seed, "--shuffle: the seed of the windows' order")
      ->capture_default_str();
  tools::add_eval_options(app, args);
  app.add_flag("--synthetic", args.synthetic,
               "Deterministic synthetic inputs (the default without --inputs)");
  app.add_option("--outputs", args.outputs_dir,
                 "Write the last step's graph outputs as DIR/NAME.npy");
  app.add_option("--threads-per-device", args.threads, "CPU threads each device's kernels use")
      ->capture_default_str()
      ->check(cli::at_least<int>(1));
  app.add_option("--trace", args.trace_path,
                 "Chrome trace of what ran (format of stagedump --trace; '-': stdout)");
  app.add_option("--trace-steps", args.trace_steps,
                 "--trace: the run's first N steps are traced (the rest are run untraced)")
      ->capture_default_str()
      ->check(cli::at_least<int64_t>(1));
  app.add_flag("--profile-nodes", args.profile_nodes,
               "Time every node of the last step on its own (CUDA: between events, one node at a "
               "time) and print a table by op type and by node: time, share, bytes moved, GB/s, "
               "TFLOP/s and the share of the device's peak; that step is left out of the step "
               "times (with --json: a node_profile record). Under mpirun: rank 0's devices");
  app.add_flag("--deterministic", args.deterministic,
               "The same bytes run after run, at some speed: CUDA convolutions use only cuDNN's "
               "deterministic algorithms (off, as in PyTorch: its fastest, some of which sum "
               "with atomics in a varying order; the CPU backend is deterministic either way)");
  app.add_option("--spin-us", args.spin_us,
                 "Microseconds a device waiting for another (a message, the step's end) watches "
                 "before it sleeps: a sleeping thread takes 50-200 us to wake, paid on every "
                 "hand-off; for workers with a core each (devices x --threads-per-device at "
                 "most the cores); 0: sleep at once")
      ->capture_default_str()
      ->check(cli::at_least<int>(0));
  app.add_flag("--json", args.json,
               "Print the figures as JSON Lines instead of text: one record per step, then a "
               "summary record (docs/schemas/stagerun.schema.json)");
  app.add_flag("-q,--quiet", args.quiet, "No progress line");
  app.add_flag("--skip-nonfinite", args.skip_nonfinite,
               "Training: go on when the loss is NaN or infinite");
  app.add_option("--checkpoint", args.checkpoint_dir,
                 "Training: save weights and optimizer state into DIR (after the last step, and "
                 "every --save-every steps)");
  app.add_option("--save-every", args.save_every,
                 "Training: save a checkpoint every K optimizer steps (needs --checkpoint)");
  app.add_option("--resume", args.resume_dir,
                 "Training: restore weights, optimizer state and step count from DIR first (a "
                 "checkpoint of any training plan of the same model and optimizer: other "
                 "devices, cuts, schedule, replicas, ZeRO-1 or precision)");
  app.add_option("--export", args.export_path,
                 "Write the original model with the trained weights to FILE.onnx after the run "
                 "(--steps 0: no run)");
  app.add_option("--timeout", args.timeout_s,
                 "Seconds a device waits for another (a message, a rank at a step's start or "
                 "end) before the run stops naming it: a rank that died or hangs; 0: no limit")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            bool number = !text.empty() && end == text.c_str() + text.size();
            return number && std::isfinite(value) && value >= 0
                       ? ""
                       : "must be a number of seconds, 0 or more, not '" + text + "'";
          },
          "SECONDS"));
  app.add_option("--bucket-mb", args.bucket_mb,
                 "Data parallelism: MiB of a stage's gradients summed over the replicas at once "
                 "(whole weights; each bucket's sum starts as soon as the backward has made it "
                 "final)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            bool number = !text.empty() && end == text.c_str() + text.size();
            // At least one float; at most what a byte count holds.
            return number && std::isfinite(value) && value * 1048576 >= 4 && value <= 1e12
                       ? ""
                       : "must be a number of MiB above 0 (at least 4 bytes), not '" + text + "'";
          },
          "MIB"));
  app.add_flag("--no-overlap", args.no_overlap,
               "Data parallelism: start the gradients' sums only at ALLREDUCE, after the whole "
               "backward (for comparison with the overlapped default)");
  app.add_option("--loss-scale", args.loss_scale,
                 "Training a precision fp16 plan: the initial dynamic loss scale S (default "
                 "65536); halves on a step with an inf or NaN gradient, which is skipped");
  app.add_option("--loss-scale-window", args.loss_scale_window,
                 "Training a precision fp16 plan: clean steps in a row before S doubles (default "
                 "2000)");
  app.add_option("--inject-fault", args.inject_fault, "Testing: make the node of this name fail")
      ->group("");
  app.add_option("--inject-kill", args.inject_kill,
                 "Testing: DEVICE:STEP[:last], the process running DEVICE kills itself (SIGKILL) "
                 "halfway through its instructions of STEP (or before the last)")
      ->group("");
  app.add_option("--inject-hang", args.inject_hang,
                 "Testing: DEVICE:STEP[:last|:save], DEVICE's worker stops answering (sleeps for "
                 "good) halfway through its instructions of STEP (or before the last, or as the "
                 "checkpoint save after STEP begins)")
      ->group("");
}

// --inject-kill and --inject-hang read: DEVICE:STEP[:last] (or :save for --inject-hang).
struct Injection {
  bool kill = false;
  int device = -1;
  int64_t step = -1;
  std::string where;  ///< "" (the middle instruction), "last" or "save".
};

std::optional<Injection> injection(const Args& args, const rt::Pipeline& p) {
  if (args.inject_kill.empty() && args.inject_hang.empty()) return std::nullopt;
  Injection in;
  in.kill = !args.inject_kill.empty();
  const char* flag = in.kill ? "--inject-kill" : "--inject-hang";
  const std::string& text = in.kill ? args.inject_kill : args.inject_hang;
  long long step = -1;
  char where[8] = "";
  int fields = std::sscanf(text.c_str(), "%d:%lld:%7s", &in.device, &step, where);
  in.step = step;
  in.where = fields == 3 ? where : "";
  const bool known = in.where.empty() || in.where == "last" || (!in.kill && in.where == "save");
  if (fields < 2 || !known || in.device < 0 || in.step < 1 || in.device >= p.devices())
    fail(ErrorKind::kUsage, "{} '{}': give DEVICE:STEP[:last{}] (device 0..{}, step from 1)", flag,
         text, in.kill ? "" : "|:save", p.devices() - 1);
  return in;
}

// The test hooks of --inject-kill and --inject-hang, run before each instruction: at the middle
// instruction of the device's list in that step, or its last (not for ':save').
std::function<void(int, int64_t, size_t)> stop_hook(const Args& args, const rt::Pipeline& p) {
  const std::optional<Injection> in = injection(args, p);
  if (!in || in->where == "save") return nullptr;
  const size_t size = p.schedule()[static_cast<size_t>(in->device % p.plan().devices)].size();
  const size_t at = in->where == "last" ? size - 1 : size / 2;
  return [kill = in->kill, device = in->device, step = in->step, at](int d, int64_t s,
                                                                     size_t index) {
    if (d != device || s != step || index != at) return;
    if (kill) raise(SIGKILL);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  };
}

// The checks of the options among themselves (before the plan is read).
void check_args(const Args& args) {
  if (args.synthetic && !args.inputs_path.empty())
    fail(ErrorKind::kUsage, "--synthetic and --inputs exclude each other");
  if (!args.tokens_path.empty() &&
      (!args.data_dir.empty() || !args.inputs_path.empty() || args.synthetic))
    fail(ErrorKind::kUsage, "--tokens excludes --data, --inputs and --synthetic");
  if (args.tokens_path.empty() &&
      (args.shuffle || (args.eval_tokens_path.empty() && (args.seq || !args.token_dtype.empty()))))
    fail(ErrorKind::kUsage, "--seq, --token-dtype and --shuffle need --tokens FILE");
  if (!args.shuffle && args.seed != 0)
    fail(ErrorKind::kUsage, "--seed {} needs --shuffle (the windows are in file order without it)",
         args.seed);
  if (args.steps < 0 || (args.steps == 0 && args.export_path.empty()))
    fail(ErrorKind::kUsage, "--steps must be at least 1 (got {}; 0 only with --export)",
         args.steps);
  if (args.save_every < 0)
    fail(ErrorKind::kUsage, "--save-every must be at least 1 (got {})", args.save_every);
  if (args.save_every > 0 && args.checkpoint_dir.empty())
    fail(ErrorKind::kUsage, "--save-every needs --checkpoint DIR");
  if (args.trace_path.empty() && args.trace_steps != 100)
    fail(ErrorKind::kUsage, "--trace-steps needs --trace FILE");
  if (args.json && args.trace_path == "-")
    fail(ErrorKind::kUsage, "--json and --trace - both write to stdout; give --trace a FILE");
  if (args.loss_scale) rt::LossScale::check_scale(*args.loss_scale, "--loss-scale");
  if (args.loss_scale_window) rt::LossScale::check_window(*args.loss_scale_window);
  tools::check_eval_args(args);
}

// --data and --tokens: the source's batches, one step per run, the next read while a step runs;
// the optimizer state, the step count and the lr schedule carry over between runs. One report
// over all the steps (of each run only its figures for the median step are kept, and the last
// one's outputs). `position` is where the data stands after the step that runs (the checkpoints
// keep it); `epoch` the epoch of its batch (--tokens; -1 otherwise), `epochs` every step's.
// `eval` (--eval-data, --eval-tokens; may be null) evaluates between the runs where due.
rt::RunReport run_batches(rt::Pipeline& pipeline, tools::BatchSource& source, const Args& args,
                          const rt::RunOptions& options, nlohmann::json& position,
                          int64_t& epoch, std::vector<int64_t>& epochs, tools::Evaluator* eval) {
  rt::RunReport report;
  tools::Prefetcher prefetch(source, args.steps);
  struct Figures {  // what the report takes of the run of the median step
    double bubble_fraction;
    std::vector<rt::DeviceReport> devices;
    std::vector<double> allreduce_s;
  };
  std::vector<Figures> runs;
  double offset = 0;
  rt::RunOptions one_step = options;  // progress is shown over all the steps, below
  one_step.steps = 1;
  one_step.progress = nullptr;
  for (int s = 0; s < args.steps; ++s) {
    one_step.trace_steps = s < options.trace_steps ? 1 : 0;
    one_step.profile_step = options.profile_step == s + 1 ? 1 : 0;
    // A checkpoint every --save-every steps and after the training's last step, not each run's.
    one_step.checkpoint_at_end = s + 1 == args.steps;
    const auto start = std::chrono::steady_clock::now();
    tools::Batch batch = prefetch.next();
    position = std::move(batch.position);
    epoch = batch.epoch.value_or(-1);
    if (batch.epoch) epochs.push_back(*batch.epoch);
    rt::RunReport r = pipeline.run(batch.inputs, one_step);
    // The next run starts after this one (its events, if traced, are within it).
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    runs.push_back({r.bubble_fraction, std::move(r.devices), std::move(r.allreduce_s)});
    report.outputs = std::move(r.outputs);
    report.step_s.push_back(r.step_s.front());
    report.losses.insert(report.losses.end(), r.losses.begin(), r.losses.end());
    report.loss_scale.insert(report.loss_scale.end(), r.loss_scale.begin(), r.loss_scale.end());
    report.skipped.insert(report.skipped.end(), r.skipped.begin(), r.skipped.end());
    report.grad_norm.insert(report.grad_norm.end(), r.grad_norm.begin(), r.grad_norm.end());
    double end = offset + took;
    for (auto e : r.events) {
      e.start_s += offset;
      e.end_s += offset;
      end = std::max(end, e.end_s);
      report.events.push_back(e);
    }
    for (rt::MemorySample m : r.memory) {
      m.time_s += offset;
      report.memory.push_back(m);
    }
    offset = end;
    if (options.progress) options.progress(s + 1, args.steps, offset);
    if (r.profiled_step == 0) {
      report.profiled_step = s;
      report.node_profile = std::move(r.node_profile);
    }
    report.stop_signal = r.stop_signal;  // a stop agreed on in the run: no more runs
    if (r.stop_signal != 0) break;
    if (eval && eval->due(pipeline.steps_done(), s + 1 == args.steps)) eval->run(pipeline, options);
  }
  report.reported_step = rt::median_step(report.step_s, report.profiled_step);
  report.bubble_fraction = runs[report.reported_step].bubble_fraction;
  report.devices = runs[report.reported_step].devices;
  report.allreduce_s = runs[report.reported_step].allreduce_s;
  return report;
}

// One line when the plan was costed for another kind of device than the backend that runs it
// (an h100 plan on the cpu backend): its predicted step, bubble and times are that device's, not
// this machine's. Names the stagec flags that cost it for the backend. "" when they match.
std::string device_kind_warning(const plan::Plan& plan, const rt::Backend& backend) {
  if (plan.device.kind == backend.kind()) return "";
  const std::string fix =
      backend.kind() == DeviceKind::kCpu
          ? "stagec --profile cpu (measured kernel times) or --device-spec cpu (roofline)"
          : "stagec --profile cuda (measured kernel times) or --device-spec h100 (or your GPU's "
            "preset or file)";
  return fmt::format(
      "the plan was costed for {} (a {} device) but runs on the {} backend: its predicted step, "
      "bubble and times are {}'s, not this machine's; re-plan with {}",
      plan.device.name, to_string(plan.device.kind), backend.name(), plan.device.name, fix);
}

// Every warning of the run, one line each: the device kind, devices sharing a
// GPU (`devices`: this process's plan devices).
std::vector<std::string> run_warnings(const plan::Plan& plan, const rt::Backend& backend,
                                      std::span<const int> devices) {
  std::vector<std::string> warnings;
  for (std::string line :
       {device_kind_warning(plan, backend), rt::processor_warning(plan, backend, devices)})
    if (!line.empty()) warnings.push_back(std::move(line));
  return warnings;
}

// One line per checkpoint saved: where, at which step, its size and how long the save took.
void say_saved(const std::string& dir, int64_t step, std::chrono::steady_clock::time_point start) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;
  double bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, ec))
    if (entry.is_regular_file(ec)) bytes += static_cast<double>(entry.file_size(ec));
  fmt::print(stderr, "stagerun: saved {} at step {}: {}, {:.2f} s\n", dir, step,
             dump::format_bytes(bytes), seconds);
}

// The run's options: progress line, fault hook, checkpoints.
// `position`: the data's position to keep in a checkpoint (null: none); `epoch`: the epoch to
// show in the progress line (< 0: none).
rt::RunOptions run_options(rt::Pipeline& pipeline, const Args& args, int64_t first_step,
                           const nlohmann::json& position, const int64_t& epoch) {
  rt::RunOptions options;
  options.steps = args.steps;
  options.timeout_s = args.timeout_s;
  options.bucket_bytes = static_cast<int64_t>(std::ceil(args.bucket_mb * 1048576));
  options.overlap_allreduce = !args.no_overlap;
  options.inject_fault = args.inject_fault;
  options.before_instruction = stop_hook(args, pipeline);
  options.skip_nonfinite = args.skip_nonfinite;
  // Per instruction, the events and memory samples of the traced steps only (a long run's
  // memory stays flat); a stop signal ends the run after the step in flight.
  options.trace_steps = args.trace_path.empty() ? 0 : args.trace_steps;
  options.stop_requested = tools::stop_requested;
  options.profile_step = args.profile_nodes ? args.steps : 0;
  options.deterministic = args.deterministic;
  options.spin_us = args.spin_us;
  bool tty = isatty(STDERR_FILENO);
  if (!args.quiet)
    options.progress = [tty, first_step, &epoch, last_shown = 0.0](int done, int total,
                                                                   double elapsed) mutable {
      if (elapsed < 2.0 || (elapsed - last_shown < 1.0 && done < total)) return;
      last_shown = elapsed;
      fmt::print(stderr, "{}stagerun: step {}/{}{}, {:.1f} s{}", tty ? "\r" : "",
                 first_step + done, first_step + total,
                 epoch >= 0 ? fmt::format(", epoch {}", epoch) : "", elapsed,
                 tty && done < total ? "" : "\n");
    };
  if (!args.checkpoint_dir.empty()) {
    options.checkpoint = [&pipeline, &position, dir = args.checkpoint_dir,
                          quiet = args.quiet](int64_t step) {
      const auto start = std::chrono::steady_clock::now();
      rt::SaveOptions save;
      save.data = position;  // --resume goes on with the data after this step's batch
      rt::save_checkpoint(pipeline, dir, save);
      if (!quiet) say_saved(dir, step, start);
    };
    options.checkpoint_every = args.save_every;
  }
  return options;
}

// Under mpirun: the plan device this rank runs (world.h refuses, on every rank alike, a world of
// another size than the plan's devices).
// The plan, read here once for the whole rank, goes to `plan`.
std::vector<int> rank_devices(rt::mpi::World& world, Args& args, std::optional<plan::Plan>& plan) {
  std::vector<int> devices;
  world.refuse_together([&] {
    plan = plan::load_plan(args.plan_dir);
    devices = world.local_devices(*plan, args.plan_dir);
  });
  return devices;
}

// --backend's backend ("auto": the best this machine can run, why in `chosen`). Under mpirun
// every rank makes the same choice (a backend this process cannot use is refused by every rank
// alike).
const rt::Backend& pick_backend(std::optional<rt::mpi::World>& world, const Args& args,
                                std::string& chosen) {
  const rt::Backend* picked = nullptr;
  auto pick = [&] {
    picked = args.backend_name == "auto" ? &rt::auto_backend(&chosen)
                                         : &rt::backend_by_name(args.backend_name);
  };
  if (world)
    world->refuse_together(pick);
  else
    pick();
  return *picked;
}

// Under mpirun every rank saves its part of each checkpoint: one writer per stage, the manifest
// by rank 0 with the data's `position` (every rank reads the same data, so all hold the same).
void rank_checkpoints(rt::RunOptions& options, rt::mpi::World& world, rt::Pipeline& pipeline,
                      const Args& args, const nlohmann::json& position) {
  // --inject-hang DEVICE:STEP:save: that device's rank stops answering as the save begins.
  const std::optional<Injection> hang = injection(args, pipeline);
  const int64_t hang_step =
      hang && hang->where == "save" && hang->device == world.rank() ? hang->step : -1;
  options.checkpoint = [&w = world, &p = pipeline, &position, dir = args.checkpoint_dir, hang_step,
                        quiet = args.quiet](int64_t step) {
    while (step == hang_step) std::this_thread::sleep_for(std::chrono::seconds(1));
    const auto start = std::chrono::steady_clock::now();
    w.save_checkpoint(p, dir, position);  // --resume goes on with the data after this step's
    if (!quiet && w.rank() == 0) say_saved(dir, step, start);
  };
}

// --export: the original model with the trained weights.
void export_trained(std::optional<rt::mpi::World>& world, rt::Pipeline& pipeline,
                    const Args& args) {
  int replaced = 0;
  if (world) {
    // Each rank holds its stages' weights: every rank saves its part of a checkpoint beside
    // FILE (one writer per stage, as --checkpoint), then rank 0 loads the whole plan on the
    // CPU, restores that checkpoint into it and exports. FILE's folder must be one the ranks
    // share, as --checkpoint's must.
    const std::string parts = args.export_path + ".checkpoint";
    world->save_checkpoint(pipeline, parts);
    if (world->rank() != 0) return;
    auto whole = rt::Pipeline::load(pipeline.plan(), args.plan_dir, rt::cpu_backend(), 1);
    rt::load_checkpoint(*whole, parts);
    replaced = rt::export_model(*whole, args.export_path);
    std::error_code ec;
    fs::remove_all(parts, ec);
  } else {
    replaced = rt::export_model(pipeline, args.export_path);
  }
  if (!args.quiet)
    fmt::print(stderr, "stagerun: wrote {} ({} trained initializers)\n", args.export_path,
               replaced);
}

/// Keeps freed memory in the process for the next step: under --data and --tokens every step is
/// its own run (`run_batches`), whose arena and kept tensors glibc would otherwise hand back
/// to the system at the run's end (mmap for blocks over 128 KiB, trimming the heap's top) and
/// fault in again, page by page, in the next: gpt_tiny on 2 CPU devices took 35 ms a step fed
/// from a token file against 23 ms from in-memory inputs, 0.9 s of 100 steps in 120,000 page
/// faults (bench/RESULTS.md, bench/token_reader.sh). Blocks up to 32 MiB (glibc's largest
/// threshold on 64-bit) now come from the heap, which is not trimmed.
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  // A rank of mpirun runs its own plan device (runtime/mpi/world.h); alone, every device.
  std::optional<rt::mpi::World> world;
  int code = run_main("stagerun", [&] {
    CLI::App app{
        "stagerun: execute a stagecraft plan with microbatch pipelining (one thread per device).",
        "stagerun"};
    Args args;
    add_options(app, args);
    cli::add_version_flag(app, "stagerun");
    if (std::optional<int> done = cli::parse(app, argc, argv)) return *done;
    check_args(args);
    std::vector<int> local_devices;  // empty: every device
    std::optional<plan::Plan> plan_read;  // plan.json, read once (by rank_devices under mpirun)
    if (rt::mpi::World::launched())
      local_devices = rank_devices(world.emplace(), args, plan_read);
    if (!args.inject_hang.empty() && !world)
      fail(ErrorKind::kUsage, "--inject-hang is for runs under mpirun (a hung thread of one "
           "process is never ended)");

    std::string chosen;
    const rt::Backend& backend = pick_backend(world, args, chosen);
    // A GPU rank takes its machine's GPU (local rank modulo the GPUs it sees) before any
    // device is made.
    std::string rank_gpu;
    if (world && backend.name() != "cpu")
      rank_gpu = fmt::format("{}, local rank {}",
                             backend.bind_local_rank(world->local_rank()).name,
                             world->local_rank());
    if (!plan_read) plan_read = plan::load_plan(args.plan_dir);
    auto pipeline =
        rt::Pipeline::load(*plan_read, args.plan_dir, backend, args.threads, local_devices);
    const plan::Plan& plan = pipeline->plan();
    std::vector<int> devices = local_devices;
    if (devices.empty())
      for (int d = 0; d < plan.devices * plan.data_parallel; ++d) devices.push_back(d);
    report_loads(*pipeline);
    const std::vector<std::string> warnings = run_warnings(plan, backend, devices);
    if (!world || world->rank() == 0)
      for (const std::string& warning : warnings)
        fmt::print(stderr, "stagerun: warning: {}\n", warning);
    if (!args.data_dir.empty() && (!args.inputs_path.empty() || args.synthetic))
      fail(ErrorKind::kUsage, "--data excludes --inputs and --synthetic");
    std::map<std::string, rt::Tensor> inputs;
    std::unique_ptr<tools::BatchSource> source;  // --data, --tokens: read step by step
    if (!args.data_dir.empty()) {
      if (!fs::is_directory(args.data_dir))
        fail(ErrorKind::kIo, "--data {}: no such directory", args.data_dir);
      source = tools::data_batches(args.data_dir, *pipeline);
    } else if (!args.tokens_path.empty()) {
      std::string note;
      source = tools::token_batches(args, *pipeline, note);
      if (!note.empty() && !args.quiet && (!world || world->rank() == 0))
        fmt::print(stderr, "stagerun: note: {}\n", note);
    }
    std::unique_ptr<tools::Evaluator> evaluator;
    auto make_evaluator = [&] {
      evaluator = tools::Evaluator::make(args, *pipeline, world ? &*world : nullptr);
    };
    if (world)
      world->refuse_together(make_evaluator);  // every rank reads the same files
    else
      make_evaluator();
    if (!source) {
      inputs = args.inputs_path.empty() ? pipeline->synthetic_inputs()
                                        : read_inputs(args.inputs_path, *pipeline);
      pipeline->check_inputs(inputs);
    }
    if ((!args.checkpoint_dir.empty() || !args.resume_dir.empty()) && !plan.training)
      fail(ErrorKind::kUsage,
           "--checkpoint and --resume need a training plan ({} is an inference plan)",
           args.plan_dir);
    // Before --resume, whose checkpoint's saved scale then wins.
    pipeline->set_loss_scale(args.loss_scale, args.loss_scale_window);
    // The data's position after the last step run (the checkpoints keep it); --resume restores
    // the checkpoint's, so the data goes on where it stopped.
    nlohmann::json position;
    if (!args.resume_dir.empty()) rt::load_checkpoint(*pipeline, args.resume_dir, &position);
    if (source) source->restore(position, args.resume_dir);
    if (!args.outputs_dir.empty()) {
      std::error_code ec;
      fs::create_directories(args.outputs_dir, ec);
      if (ec)
        fail(ErrorKind::kIo, "--outputs {}: cannot create ({})", args.outputs_dir, ec.message());
    }

    // Steps are counted from 1 and, after --resume, go on from the checkpoint's count, as the
    // loss lines and error messages number them.
    const int64_t first_step = pipeline->steps_done();  // > 0 after --resume
    int64_t epoch = -1;                // of the step that runs (--tokens)
    std::vector<int64_t> epochs;       // of every step run (--tokens)
    rt::RunOptions options = run_options(*pipeline, args, first_step, position, epoch);
    if (world) {
      const std::string transport = world->distribute(options, *pipeline, args.transport);
      // GPU ranks: one line each, saying which GPU and which transport.
      if (!rank_gpu.empty())
        fmt::print(stderr, "stagerun: {}: backend {}{} on {}; transport {}\n", world->name(),
                   backend.name(), chosen.empty() ? "" : fmt::format(" (auto: {})", chosen),
                   rank_gpu, transport);
    }
    if (world && options.checkpoint) rank_checkpoints(options, *world, *pipeline, args, position);
    if (args.steps == 0) {
      export_trained(world, *pipeline, args);
      return 0;
    }
    tools::install_stop_handlers(world.has_value());
    rt::RunReport report =
        source ? run_batches(*pipeline, *source, args, options, position, epoch, epochs,
                             evaluator.get())
               : pipeline->run(inputs, options);
    // A stopped run is resumed from its checkpoint, not exported.
    const int code = report.stop_signal != 0 ? tools::kStoppedExitCode : 0;
    if (!args.export_path.empty() && code == 0) export_trained(world, *pipeline, args);
    if (world) {
      if (code != 0) world->end_together();  // every rank stops after the same step
      world->gather(report, plan);            // rank 0 prints for all
      if (world->rank() != 0) return code;
    }

    nlohmann::ordered_json outputs = write_outputs(report, args.outputs_dir);
    write_trace(report, args, *pipeline);
    const std::string gap = prediction_gap(
        report, plan, backend.name(), static_cast<int>(devices.size()), args.threads, warnings);
    if (args.json)
      print_json(report, *pipeline, args, backend.name(), chosen, first_step, outputs, warnings,
                 gap, epochs);
    else if (args.trace_path != "-")
      print_text(report, *pipeline, args,
                 chosen.empty() ? std::string(backend.name())
                                : fmt::format("{} (auto: {})", backend.name(), chosen),
                 first_step, outputs, gap, epochs);
    if (report.profiled_step >= 0) print_profile(report, *pipeline, args, backend, first_step);
    if (code != 0)
      fmt::print(stderr, "stagerun: {}\n",
                 tools::stopped_line(report.stop_signal,
                                     first_step + static_cast<int64_t>(report.step_s.size()),
                                     plan.training ? args.checkpoint_dir : std::string()));
    return code;
  });
  return world ? world->finish(code) : code;
}
