// stagec: the offline compiler's command line.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "compiler/import.h"
#include "compiler/model_info.h"
#include "compiler/plan/auto_search.h"
#include "compiler/plan/planner.h"
#include "cost_models/profile_db.h"
#include "runtime/format/error.h"
#include "runtime/optim/lr_schedule.h"
#include "tools/backend_check.h"
#include "tools/cli_common.h"
#include "tools/json_formats.h"
#include "tools/profile/instruction_costs.h"
#include "tools/profile/profiler.h"
#include "tools/stagec_calibrate.h"

namespace {

namespace cli = stagecraft::cli;

/// Where --profile keeps its database when --profile-db is not given: the XDG cache folder
/// ($XDG_CACHE_HOME, else ~/.cache), else the current folder.
std::string default_profile_db(const std::string& backend, int threads) {
  namespace fs = std::filesystem;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path dir = xdg && *xdg     ? fs::path(xdg) / "stagecraft"
                 : home && *home ? fs::path(home) / ".cache" / "stagecraft"
                                 : fs::path(".");
  return (dir / (backend == "cpu" ? fmt::format("profile-cpu-{}threads.json", threads)
                                  : fmt::format("profile-{}.json", backend)))
      .string();
}

/// The profile database at `db_path` (an empty one when there is none), made this build's: one
/// measured with other kernels loses its measurements, with a line on stderr saying so, and
/// `*refreshed` (when given) says whether it did (profile::refresh_kernels).
stagecraft::cost::ProfileDb open_profile_db(const std::string& db_path, const std::string& backend,
                                            int threads, bool* refreshed = nullptr) {
  using namespace stagecraft;
  cost::ProfileDb db = cost::ProfileDb::open(db_path, backend, threads);
  const std::string stale = profile::refresh_kernels(db, db_path);
  if (!stale.empty()) fmt::print(stderr, "stagec: note: {}\n", stale);
  if (refreshed) *refreshed = !stale.empty();
  return db;
}

/// The measured cost model of --profile cpu: profiles the signatures of the planner's graph that
/// the database at `db_path` lacks (with `training`, their gradient ops too), saves it, prints a
/// summary line (and one line per backward left to the roofline ratio), and reads times from it.
std::unique_ptr<stagecraft::cost::OpCostModel> profiled_costs(
    const stagecraft::ir::Graph& graph, const stagecraft::cost::RooflineCostModel& roofline,
    const std::string& db_path, const std::string& backend, int threads, bool training) {
  using namespace stagecraft;
  using Clock = std::chrono::steady_clock;
  std::error_code ec;
  const bool existed = std::filesystem::exists(db_path, ec);
  bool refreshed = false;
  cost::ProfileDb db = open_profile_db(db_path, backend, threads, &refreshed);
  const std::size_t before = db.size();
  const auto start = Clock::now();
  double last_shown = 0;
  int attempted = 0;  // forward and backward measurements tried so far
  auto progress = [&](int done, int total) {
    attempted = done;
    // Quiet for short runs; a line a second once it takes longer than two.
    double t = std::chrono::duration<double>(Clock::now() - start).count();
    if (t < 2.0 || (t - last_shown < 1.0 && done != total)) return;
    last_shown = t;
    fmt::print(stderr, "profiling: {}/{} signatures\n", done, total);
  };
  const auto direction =
      training ? profile::Direction::kForwardAndBackward : profile::Direction::kForward;
  profile::ProfileStats stats;
  try {
    stats = profile::profile_graph(graph, db, threads, direction, progress);
  } catch (...) {
    // Keep what was measured before the failure.
    if (db.size() > before || attempted > 0) db.save(db_path);
    throw;
  }
  // A version-1 file is written back as the current version once anything is added to it.
  if (stats.measured > 0 || stats.backward_measured > 0 || !existed || refreshed)
    db.save(db_path);
  std::string backward;
  if (training) {
    backward =
        fmt::format(", backward of {} ({} cached, {} by roofline ratio)", stats.backward_signatures,
                    stats.backward_cached, stats.backward_by_ratio.size());
  }
  fmt::print("profiled {} signatures ({} cached){} in {:.2f} s; db {}\n", stats.signatures,
             stats.cached, backward, stats.seconds, db_path);
  for (const std::string& why : stats.backward_by_ratio) {
    fmt::print("backward by the roofline's backward/forward ratio: {}\n", why);
  }
  return std::make_unique<cost::MeasuredCostModel>(
      db, roofline,
      training ? cost::BackwardTimes::kMeasured : cost::BackwardTimes::kNone);
}

/// The fixed instruction costs of --profile's database (measured first when it has none) and
/// the calibration it keeps for `key` (stagec --calibrate), if any.
stagecraft::cost::TermsChoice instruction_terms(const std::string& db_path,
                                                const std::string& backend, int threads,
                                                const std::string& key) {
  using namespace stagecraft;
  // A refreshed database has no instruction costs left either: measured below.
  cost::ProfileDb db = open_profile_db(db_path, backend, threads);
  if (db.instruction_ms().empty()) {
    db.set_instruction_ms(profile::measure_instruction_costs(threads, backend));
    db.save(db_path);
  }
  cost::TermsChoice choice;
  choice.profiled.source = "profile";
  choice.profiled.instruction_ms = db.instruction_ms();
  if (const cost::InstructionTerms* calibrated = db.find_calibration(key))
    choice.calibrated = *calibrated;
  return choice;
}

/// `json` (an object) with `format_version` first: the --json outputs are JSON Lines, each
/// record carrying its version (tools/json_formats.h).
nlohmann::ordered_json versioned(int version, const nlohmann::ordered_json& json) {
  nlohmann::ordered_json out{{"format_version", version}};
  for (const auto& [key, value] : json.items()) out[key] = value;
  return out;
}

/// "float32[8,16,64]" for each output of `node` ("?" where the shape is not known), comma
/// separated.
std::string output_shapes(const stagecraft::ir::Graph& graph, const stagecraft::ir::Node& node) {
  using namespace stagecraft;
  std::vector<std::string> shapes;
  for (ir::ValueId id : node.outputs) {
    if (id == ir::kNoId) continue;
    const ir::Value& v = graph.value(id);
    shapes.push_back(fmt::format("{}{}", dtype_name(v.dtype),
                                 v.shape_known ? ir::shape_string(v.shape) : "[?]"));
  }
  return fmt::format("{}", fmt::join(shapes, ","));
}

/// --list-nodes: the model's nodes in the topological order the planner cuts (--split-after
/// NODE cuts after NODE in this order), one line each (name, op type, output shapes), runs of a
/// PyTorch module's nodes under a "# MODULE: N nodes" line (--split-after MODULE), or with
/// `json` one object on one line {format_version, model, nodes [{name, op_type, outputs [{name,
/// dtype, shape}]}]} (docs/schemas/stagec-list-nodes.schema.json).
std::string list_nodes(const stagecraft::ImportedModel& model, const std::string& path,
                       bool json) {
  using namespace stagecraft;
  const ir::Graph& g = model.graph;
  const std::vector<ir::NodeId> order = g.topological_order();
  if (json) {
    nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
    for (ir::NodeId id : order) {
      const ir::Node& node = g.node(id);
      nlohmann::ordered_json outputs = nlohmann::ordered_json::array();
      for (ir::ValueId out : node.outputs) {
        if (out == ir::kNoId) continue;
        const ir::Value& v = g.value(out);
        outputs.push_back({{"name", v.name},
                           {"dtype", dtype_name(v.dtype)},
                           {"shape", v.shape_known ? nlohmann::ordered_json(v.shape)
                                                   : nlohmann::ordered_json(nullptr)}});
      }
      nodes.push_back({{"name", node.name}, {"op_type", node.op_type}, {"outputs", outputs}});
    }
    return nlohmann::ordered_json{{"format_version", stagecraft::tools::kListNodesJsonVersion},
                                  {"model", path},
                                  {"nodes", nodes}}
               .dump() +
           "\n";
  }
  std::size_t name_width = 4, op_width = 2;
  for (ir::NodeId id : order) {
    name_width = std::max(name_width, g.node(id).name.size());
    op_width = std::max(op_width, g.node(id).op_type.size());
  }
  // Nodes grouped by the PyTorch module of their scope, two levels deep (a layer: enc.layers.2),
  // each group of two or more nodes under a line naming it for --split-after.
  std::string text;
  for (std::size_t i = 0; i < order.size();) {
    const std::string module = module_of(g.node(order[i]).name, 2);
    std::size_t end = i + 1;
    while (end < order.size() && !module.empty() && module_of(g.node(order[end]).name, 2) == module)
      ++end;
    if (end - i > 1)
      text += fmt::format("# {}: {} nodes (--split-after {} cuts after the last)\n", module,
                          end - i, module);
    for (; i < end; ++i) {
      const ir::Node& node = g.node(order[i]);
      text += fmt::format("{:<{}}  {:<{}}  {}\n", node.name, name_width, node.op_type, op_width,
                          output_shapes(g, node));
    }
  }
  return text;
}

/// The planning choices as the command line spells them; parsed once, into the plan's
/// vocabulary (runtime/format/vocabulary.h), by `parse_choices`.
struct ChoiceNames {
  std::string objective = "speed", schedule, optimizer = "adamw", precision = "fp32",
              recompute = "none", lr_scaling = "none", data_parallel = "1";
  bool search = false;  ///< --auto: the choices not given are searched.
};

/// Registers the planning flags: numbers straight into `po`, the named choices into `names`.
void add_plan_options(CLI::App& app, stagecraft::plan::PlanOptions& po, ChoiceNames& names) {
  app.add_option("--devices", po.devices,
                 "devices in all: P pipeline devices, or R x P with --data-parallel R")
      ->check(cli::at_least<int>(1));
  app.add_option("--data-parallel", names.data_parallel,
                 "R replicas of a pipeline of devices / R devices, each taking 1/R of every "
                 "batch (global batch = R x microbatches x microbatch); training sums each "
                 "stage's gradients over the replicas before its optimizer step (default 1); "
                 "auto: every R dividing the devices is planned and the highest predicted "
                 "throughput that fits is kept")
      ->check(CLI::Validator(
          [](const std::string& text) -> std::string {
            if (text == "auto") return "";
            std::string why = cli::at_least<int>(1)(text);
            return why.empty() ? "" : why + " (or 'auto')";
          },
          "R|auto"));
  app.add_flag("--shard-optimizer", po.shard_optimizer,
               "with --train and --data-parallel R >= 2 (ZeRO-1): each replica keeps only 1/R of "
               "every stage's optimizer state; the gradients are reduce-scattered and the updated "
               "weights all-gathered");
  app.add_option("--freeze", po.freeze,
                 "with --train: leave the float32 initializers whose names match PATTERN untrained "
                 "(no gradient, no optimizer state; a glob: '*' any characters, '?' one; "
                 "repeatable), e.g. the buffers of torchvision's FrozenBatchNorm2d, which an "
                 "ONNX file stores as ordinary initializers")
      ->type_name("PATTERN");
  app.add_option("--train-also", po.train_also,
                 "with --train: train the float32 initializers matching PATTERN although they "
                 "look like PyTorch buffers (by default an initializer holding -inf or NaN, or "
                 "an additive attention mask feeding a Softmax, is left untrained and listed, "
                 "and an embedding table's lone row of zeros, nn.Embedding's padding_idx, gets "
                 "no gradient from its lookups; repeatable)")
      ->type_name("PATTERN");
  app.add_option("--lr-scaling", names.lr_scaling,
                 "with --train: none | linear | sqrt: the learning rate times R, sqrt(R) or 1 for "
                 "R data-parallel replicas (default none)");
  app.add_option("--objective", names.objective,
                 "speed: shortest predicted step; memory: smallest peak per device");
  app.add_option(
      "--schedule", names.schedule,
      "gpipe (SageMaker's 'simple') | 1f1b (SageMaker's 'interleaved') | interleaved (Megatron "
      "virtual stages) | zb-h1 | zb-v (2 chunks per device in a V, device i holding stages i "
      "and 2P-1-i) | dualpipev (DeepSeek's DualPipeV: zb-v's V, a forward paired with a "
      "backward, M >= 2P) | inference; default 1f1b with --train, else inference");
  app.add_option("--schedule-csv", po.schedule_csv,
                 "a custom schedule in torch.distributed.pipelining's action-list CSV (one row "
                 "per rank of actions such as 0F1, 1B0, 0I2, 0W2, as torch's _dump_csv writes "
                 "and stagedump --torch-csv writes): planned and run as schedule 'custom'; its "
                 "chunks and microbatches are the file's; stage s must be on rank s mod P")
      ->type_name("FILE");
  app.add_option("--chunks", po.chunks,
                 "V model chunks per device for --schedule interleaved (default 2)")
      ->check(cli::at_least<int>(1));
  app.add_option("--microbatches", po.microbatches,
                 "M microbatches per step of each replica (default: the pipeline's device count)")
      ->check(cli::at_least<int>(1));
  app.add_flag("--train", po.training, "plan training: forward, backward and optimizer step");
  app.add_flag("--keep-merged", po.keep_merged,
               "with --train: keep weights that torch's exporter merged into equal ones (an "
               "Identity under the duplicate's name, as an eval-mode export of fresh LayerNorms "
               "or deep-copied layers writes) shared; by default each trains apart, as in PyTorch");
  app.add_flag("--fuse-attention,!--no-fuse-attention", po.fuse_attention,
               "each attention block (MatMul, scale, mask, Softmax, MatMul) becomes one fused "
               "Attention node that keeps no [Tq, Tk] scores or probabilities for the backward "
               "(--info says which were fused and why the others were not); on by default, "
               "--no-fuse-attention keeps the exporter's ops");
  app.add_flag("--fuse-gelu,!--no-fuse-gelu", po.fuse_gelu,
               "each GELU (the erf form or its tanh approximation) becomes one fused Gelu node "
               "whose backward keeps only its input (--info counts them: fuse-gelu); on by "
               "default, --no-fuse-gelu keeps the exporter's ops");
  app.add_flag("--keep-training-mode", po.keep_training_mode,
               "without --train: keep Dropout and BatchNormalization that a training-mode export "
               "left in training mode as they are (by default an inference plan runs them in "
               "inference mode, as PyTorch's eval())");
  app.add_option("--optimizer", names.optimizer,
                 "with --train: sgd | momentum | nesterov | adam | adamw | adagrad (default adamw; "
                 "adam8bit: memory "
                 "planning only)");
  app.add_option(
      "--loss", po.loss.kind,
      "with --train: mse | cross-entropy, appended to the model's output (default: the model's own "
      "scalar output is the loss)");
  app.add_option("--labels", po.loss.labels,
                 "with --loss: the labels input (default 'labels'; added when the model "
                 "has none)");
  app.add_option(
      "--loss-axis", po.loss.axis,
      "with --loss cross-entropy: the output's class axis K (negative counts from the end). "
      "Default: "
      "from the labels input's shape (the output without its last axis: the last axis, language "
      "models' [B,T,V] with [B,T]; without axis 1: axis 1, ONNX's [N,C,...]; both or neither: an "
      "error); "
      "labels stagec adds: axis 1 for [N,C] and for rank 4 or more ([N,C,H,W], as PyTorch's "
      "cross_entropy), the last axis for rank 3 (a language model's [B,T,V])");
  app.add_option("--ignore-index", po.loss.ignore_index,
                 "with --loss cross-entropy: the label value of padding, left out of the loss and "
                 "of the mean's "
                 "count (default -100, PyTorch's)");
  app.add_option("--lr", po.training_config.lr, "with --train: learning rate (default 0.001)");
  app.add_option("--weight-decay", po.training_config.weight_decay,
                 "with --train: weight decay (default 0)");
  app.add_option("--clip-grad-norm", po.training_config.clip_grad_norm,
                 "with --train: C, clip the gradients to a global L2 norm of at most C before "
                 "each optimizer step (every gradient times min(1, C / (norm + 1e-6)), the norm "
                 "over every trained weight of every stage, shared weights once), as PyTorch's "
                 "clip_grad_norm_; stagerun --json reports the norm per step (default: none)");
  app.add_option("--momentum", po.training_config.momentum,
                 "with --optimizer momentum|nesterov (default 0.9)");
  app.add_option("--lr-schedule", po.training_config.lr_schedule,
                 "with --train: constant | warmup-linear | cosine (default constant)");
  app.add_option("--warmup-steps", po.training_config.warmup_steps,
                 "with --lr-schedule: linear warm-up steps");
  app.add_option("--total-steps", po.training_config.total_steps,
                 "with --lr-schedule warmup-linear|cosine: the step where the rate reaches 0");
  app.add_option("--precision", names.precision,
                 "fp32 | mixed (bfloat16 compute, fp32 master weights) | fp16 (float16 "
                 "compute, fp32 masters; training scales the loss dynamically: stagerun "
                 "--loss-scale)");
  app.add_option(
      "--device-spec", po.device_spec,
      "h100 | h200 | a100-80g | a100-40g | v100-16g | cpu, or a JSON file with peak_flops_fp32, "
      "peak_flops_fp16, memory_bandwidth, memory_bytes, launch_overhead_s, efficiency");
  app.add_option("--cluster", po.cluster,
                 "JSON file: devices_per_node and the intra/inter-node link bandwidth and latency "
                 "(default: the device kind's NVLink/InfiniBand figures)");
  app.add_option("--devices-per-processor", po.devices_per_processor,
                 "K pipeline devices share each processor (several devices on one GPU, CPU "
                 "devices whose threads outnumber the cores): device d computes on processor d "
                 "mod ceil(P/K), one compute instruction of a processor's devices at a time, and "
                 "their transfers are local copies (default: the --cluster file's "
                 "devices_per_processor, else 1; at most the pipeline's devices)")
      ->check(cli::at_least<int>(1));
  app.add_option("--processor-overlap", po.processor_overlap,
                 "with --devices-per-processor K > 1: the part of a compute instruction another "
                 "device of its processor may overlap, in [0, 1) (default 0: they take turns)");
  app.add_option(
      "--recompute", names.recompute,
      "with --train: activation recomputation. none (default); all: every stage keeps only its "
      "inputs per microbatch and re-runs its forward before the backward; auto: with --objective "
      "speed, "
      "only on the devices that would not fit without it, the stages it saves most on first "
      "(the split search counts it); with --objective memory, every stage whose memory it "
      "lowers");
}

/// --auto: the choices the command line does not give, searched (compiler/plan/auto_search.h).
void add_auto_option(CLI::App& app, ChoiceNames& names) {
  app.add_flag(
      "--auto", names.search,
      "with --batch: choose the schedule, --microbatches (the divisors of the batch up to 8 per "
      "pipeline device), --chunks (2-4 for interleaved), --recompute (none, auto) and "
      "--data-parallel (the divisors of --devices) by planning and simulating each "
      "configuration, each device's memory a hard limit; keeps the shortest predicted step (with "
      "--objective memory the smallest peak). Any of those flags given is held fixed. Prints the "
      "choice and the next 5; plan.json's auto_search lists every configuration");
}

/// Parses the named choices into `po`; a bad name is a usage error naming the flag and listing
/// the valid names ("--objective: unknown objective 'fast'; valid: speed, memory").
void parse_choices(const ChoiceNames& names, stagecraft::plan::PlanOptions& po) {
  using namespace stagecraft;
  auto flag = [](const char* name, auto parse) {
    return with_context(name, ErrorKind::kUsage, parse);
  };
  po.objective = flag("--objective", [&] { return parse_objective(names.objective); });
  if (!names.schedule.empty())
    po.schedule = flag("--schedule", [&] { return parse_schedule(names.schedule); });
  po.optimizer = flag("--optimizer", [&] { return parse_optimizer(names.optimizer); });
  po.precision = flag("--precision", [&] { return parse_precision(names.precision); });
  po.recompute = flag("--recompute", [&] { return parse_recompute(names.recompute); });
  po.lr_scaling = flag("--lr-scaling", [&] { return parse_lr_scaling(names.lr_scaling); });
  po.data_parallel_auto = names.data_parallel == "auto";
  if (!po.data_parallel_auto) po.data_parallel = std::stoi(names.data_parallel);  // checked
}

/// The planner's one-line notes on what it decided about the model beyond the split: the loss,
/// training-mode nodes of an inference plan, untied and untrained weights, BatchNormalization,
/// the replica count and placement ("" lines are left out).
void print_planner_notes(const stagecraft::plan::PlannedModel& planned) {
  if (!planned.loss_summary.empty()) fmt::print("{}\n", planned.loss_summary);
  for (const std::string* note :
       {&planned.inference_mode_summary, &planned.untie_summary, &planned.batch_norm_summary,
        &planned.freeze_summary, &planned.data_parallel_choice, &planned.placement_choice})
    fmt::print("{}", *note);
}

/// Refuses flags that would be silently ignored: the training flags without --train, --labels
/// without --loss, --momentum with an optimizer that has none; and a --clip-grad-norm C <= 0.
void check_flags_apply(const CLI::App& app, const stagecraft::plan::PlanOptions& po) {
  using namespace stagecraft;
  if (app.count("--clip-grad-norm") > 0) {
    const double clip = po.training_config.clip_grad_norm;
    if (!po.training)
      fail(ErrorKind::kUsage, "--clip-grad-norm {}: clips a training plan's gradients; add --train",
           clip);
    if (!(std::isfinite(clip) && clip > 0))
      fail(ErrorKind::kUsage, "--clip-grad-norm {}: must be a finite number > 0", clip);
  }
  std::vector<std::string> given;
  for (const char* flag : {"--optimizer", "--loss", "--labels", "--loss-axis", "--ignore-index",
                           "--lr", "--weight-decay", "--momentum", "--lr-schedule",
                           "--warmup-steps", "--total-steps", "--recompute", "--lr-scaling",
                           "--freeze", "--train-also", "--keep-merged"}) {
    if (app.count(flag) > 0) given.push_back(flag);
  }
  if (!po.training && !given.empty()) {
    fail(ErrorKind::kUsage, "{} {} only for training plans: add --train, or leave {} out",
         fmt::join(given, ", "), given.size() == 1 ? "is" : "are",
         given.size() == 1 ? "it" : "them");
  }
  if (po.training && po.keep_training_mode)
    fail(ErrorKind::kUsage,
         "--keep-training-mode is for inference plans (a training plan keeps Dropout and "
         "BatchNormalization as exported); leave it out with --train");
  if (app.count("--labels") > 0 && po.loss.kind.empty())
    fail(ErrorKind::kUsage, "--labels names the labels of --loss mse or cross-entropy; add --loss");
  if (app.count("--momentum") > 0 && po.optimizer != OptimizerKind::kMomentum &&
      po.optimizer != OptimizerKind::kNesterov) {
    fail(ErrorKind::kUsage, "--momentum is only for --optimizer momentum or nesterov, not {}",
         to_string(po.optimizer));
  }
}

/// The training numbers as stagerun will read them, checked with the runtime's own rules
/// (runtime/optim) before planning, each with its flag: stagec writes no plan stagerun refuses,
/// and a NaN or infinity cannot even be written to plan.json.
void check_training_flags(const stagecraft::plan::PlanOptions& po) {
  using namespace stagecraft;
  if (!po.training) return;
  const plan::TrainingConfig& c = po.training_config;
  for (auto [flag, value] : {std::pair<const char*, double>{"--lr", c.lr},
                             {"--weight-decay", c.weight_decay},
                             {"--momentum", c.momentum}}) {
    if (!std::isfinite(value) || value < 0)
      fail(ErrorKind::kUsage, "{} {}: must be a finite number >= 0", flag, value);
  }
  rt::optim::LrSchedule schedule;
  schedule.kind = with_context("--lr-schedule", ErrorKind::kUsage,
                               [&] { return rt::optim::parse_lr_schedule(c.lr_schedule); });
  schedule.base_lr = c.lr;
  schedule.warmup_steps = c.warmup_steps;
  schedule.total_steps = c.total_steps;
  with_context(fmt::format("--lr-schedule {}", c.lr_schedule), ErrorKind::kUsage,
               [&] { rt::optim::validate(schedule); });
}

/// Writes the plan, saying every GiB of weights how far it is (a large model's weights are read
/// once, to hash them, or copied with --copy-weights); returns the seconds it took.
double write_with_progress(stagecraft::plan::PlannedModel& planned, const std::string& out_dir,
                           stagecraft::plan::WeightWriting writing) {
  const auto start = std::chrono::steady_clock::now();
  const bool copy = writing.copy;
  writing.progress = [start, copy](int64_t placed, int stage, int stages) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print(stderr, "stagec: {:.1f} GiB of weights {} (stage {} of {}), {:.1f} s\n",
               static_cast<double>(placed) / (1 << 30), copy ? "copied" : "hashed", stage + 1,
               stages, s);
  };
  stagecraft::plan::write_plan(planned, out_dir, writing);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// --auto: the searched choices the command line gave, held fixed.
stagecraft::plan::AutoFixed auto_fixed(const CLI::App& app,
                                       const stagecraft::plan::PlanOptions& po) {
  return {.schedule = app.count("--schedule") > 0,
          .microbatches = app.count("--microbatches") > 0,
          .chunks = app.count("--chunks") > 0,
          .recompute = app.count("--recompute") > 0,
          .data_parallel = app.count("--data-parallel") > 0 && !po.data_parallel_auto};
}

/// --auto's progress on stderr: quiet for a search shorter than two seconds, then a line a
/// second with the best configuration so far.
stagecraft::plan::AutoProgress auto_progress() {
  auto last_shown = std::make_shared<double>(0);
  return [last_shown](int done, int total, const stagecraft::plan::AutoCandidate* best,
                      double seconds) {
    if (seconds < 2.0 || seconds - *last_shown < 1.0) return;
    *last_shown = seconds;
    fmt::print(stderr, "stagec --auto: {}/{} configurations, {:.1f} s; best so far: {}\n", done,
               total, seconds,
               best ? fmt::format("{} x{}, {} microbatches, {} replicas, recompute {}: {:.3f} ms",
                                  best->schedule, best->chunks, best->microbatches,
                                  best->data_parallel, best->recompute, best->step_ms)
                    : "none that fits yet");
  };
}

/// --profile BACKEND: plan with the times measured by that backend (checked usable here first),
/// the CPU's memory and links with --profile cpu unless --device-spec says otherwise.
void use_profile(const CLI::App& app, stagecraft::plan::PlanOptions& po,
                 const std::string& profile_backend, const std::string& profile_db,
                 int profile_threads) {
  using namespace stagecraft;
  // Before any planning: the backend must run here (cuda: a GPU is visible).
  std::string why = profile_backend == "cuda" ? rt::cuda_unusable() : "";
  if (!why.empty())
    fail(ErrorKind::kUnsupported, "--profile {}: {}; use --profile cpu", profile_backend, why);
  // Measured CPU times: the device's memory and links are the CPU's unless told otherwise.
  if (app.count("--device-spec") == 0 && profile_backend == "cpu") po.device_spec = "cpu";
  std::string db_path =
      profile_db.empty() ? default_profile_db(profile_backend, profile_threads) : profile_db;
  po.cost_model = [db_path, profile_backend, profile_threads, training = po.training](
                      const ir::Graph& graph, const cost::RooflineCostModel& roofline) {
    return profiled_costs(graph, roofline, db_path, profile_backend, profile_threads, training);
  };
  po.instruction_terms = [db_path, profile_backend, profile_threads](const std::string& key) {
    return instruction_terms(db_path, profile_backend, profile_threads, key);
  };
}

/// --calibrate TRACE (stagec PLAN_DIR --calibrate TRACE): tools/stagec_calibrate.h.
void add_calibrate_option(CLI::App& app, std::string& calibrate_trace) {
  app.add_option("--calibrate", calibrate_trace,
                 "stagec PLAN_DIR --calibrate TRACE [--profile-db DB]: fit per-instruction fixed "
                 "costs and per-(stage, kind) factors to TRACE (stagerun PLAN_DIR --trace TRACE, "
                 "2 steps or more; the first is left out) and keep them in the profile database "
                 "the plan was made with; the next stagec --profile cpu plan of the same model "
                 "and shape is calibrated with them (docs/stagec.md)");
}

/// With --calibrate: calibrates (MODEL is then the plan directory) and returns true.
bool run_calibration(const std::string& trace, const std::string& plan_dir,
                     const std::string& profile_db, int profile_threads) {
  if (trace.empty()) return false;
  stagecraft::tools::calibrate(
      plan_dir, trace, profile_db.empty() ? default_profile_db("cpu", profile_threads) : profile_db);
  return true;
}

/// How --info and --list-nodes import the model: as a plan with these flags would.
stagecraft::ImportOptions info_import(const stagecraft::plan::PlanOptions& po,
                                      std::optional<int64_t> batch,
                                      const std::vector<std::string>& dims) {
  stagecraft::ImportOptions options;
  options.batch = batch;
  options.training = po.training;
  options.fuse_attention = po.fuse_attention;
  options.fuse_gelu = po.fuse_gelu;
  for (const auto& d : dims) stagecraft::parse_dim_binding(d, options);
  return options;
}

int run(int argc, char** argv) {
  using namespace stagecraft;
  CLI::App app{
      "stagec - compile an ONNX model into a pipeline-parallel plan.\n\n"
      "  stagec MODEL --info [--batch B] [--dim NAME=V]...      what the model is\n"
      "  stagec MODEL --list-nodes [--batch B] [--dim NAME=V]... its nodes, for --split-after\n"
      "  stagec MODEL -o PLAN_DIR --devices N [options]          plan it\n\n"
      "Import checks the model (ONNX checker, strict shape inference), binds symbolic input dims\n"
      "from --batch and --dim, and folds the shape arithmetic exporters emit into constants.\n"
      "Planning costs every op on the device (analytic roofline, or with --profile cpu the times "
      "the\n"
      "CPU backend's kernels take, cached in a profile database), splits the graph into\n"
      "devices x chunks stages (exact over cuts of a topological order, memory a hard limit),\n"
      "builds the schedule, simulates it, and writes "
      "PLAN_DIR/{plan.json,schedule.json,stage_K.onnx}.\n"
      "Inspect a plan with stagedump PLAN_DIR.",
      "stagec"};
  std::string model_path;
  bool info = false, list = false, json = false, dry_run = false;
  std::optional<int64_t> batch;
  std::vector<std::string> dims;
  std::string out_dir;
  plan::PlanOptions po;
  app.add_option(
         "MODEL", model_path,
         "ONNX model file (.onnx); external weight files must sit in its folder (with --calibrate: "
         "the plan directory)")
      ->required();
  app.add_flag(
      "--info", info,
      "print what the model is: opset, inputs/outputs with bound shapes, node count by op, "
      "parameters, forward FLOPs, which dims were bound");
  app.add_flag("--list-nodes", list,
               "print the model's nodes in the order the planner cuts them, one line each: name, "
               "op type, output shapes at --batch and --dim (for choosing --split-after)");
  app.add_flag("--json", json,
               "with --info or --list-nodes: print the same facts as one JSON object on one line "
               "(schemas in docs/schemas/)");
  app.add_option(
      "--batch", batch,
      "global batch: binds the first dim of every input whose first dim is symbolic (when "
      "planning, each microbatch gets batch/microbatches)")
      ->check(cli::at_least<int64_t>(1));
  app.add_option("--dim", dims,
                 "bind a symbolic dim by name, NAME=VALUE (e.g. --dim seq=512), or an unnamed one "
                 "as INPUT:INDEX=VALUE; repeatable");
  app.add_option("-o,--output", out_dir,
                 "plan directory to write (replaced atomically if it holds a plan)");
  ChoiceNames choice_names;
  add_plan_options(app, po, choice_names);
  add_auto_option(app, choice_names);
  app.add_option("--split-after", po.split_after,
                 "manual split points: node names or PyTorch module paths (enc.layers.2: after that "
                 "module's last node), comma separated (stagec MODEL --list-nodes lists them)")
      ->delimiter(',');
  app.add_flag("--dry-run", dry_run,
               "plan and print, writing no plan (--profile still caches what it measures)");
  plan::WeightWriting weight_writing;
  app.add_flag("--copy-weights", weight_writing.copy,
               "copy the model's external-data weights into the plan directory (a self-contained "
               "plan to ship); by default stage files reference them where they are and stagerun "
               "reads each device's share from there");
  std::string profile_backend, profile_db;
  int profile_threads = 1;
  app.add_option(
      "--profile", profile_backend,
      "cpu or cuda: measure each distinct op signature with that backend's kernels (cuda: timed "
      "with CUDA events on the GPU) and plan with those times instead of the roofline; with "
      "--train also its gradient ops as autodiff writes them (input- and weight-gradient parts "
      "apart; the roofline's backward/forward ratio only where the backend has no gradient "
      "kernel, each such op reported); with cpu the device spec defaults to cpu");
  app.add_option("--profile-db", profile_db,
                 "with --profile: the profile database (JSON) to read and extend (default: "
                 "$XDG_CACHE_HOME/stagecraft/profile-cpu-<T>threads.json or profile-cuda.json, "
                 "~/.cache/stagecraft/... without XDG_CACHE_HOME)");
  app.add_option("--profile-threads", profile_threads,
                 "with --profile: CPU threads each op is measured with (default 1, as stagerun "
                 "--threads-per-device)")
      ->check(cli::at_least<int>(1));
  std::string calibrate_trace;
  add_calibrate_option(app, calibrate_trace);
  cli::add_version_flag(app, "stagec");
  if (std::optional<int> done = cli::parse(app, argc, argv)) return *done;

  if (run_calibration(calibrate_trace, model_path, profile_db, profile_threads)) return 0;
  parse_choices(choice_names, po);
  check_flags_apply(app, po);
  check_training_flags(po);
  const ImportOptions options = info_import(po, batch, dims);
  if (json && !info && !list) {
    fail(ErrorKind::kUsage,
         "--json needs --info or --list-nodes (stagedump PLAN_DIR --json shows a plan)");
  }
  if (info && list) fail(ErrorKind::kUsage, "--info and --list-nodes: give one of them");
  if (info || list) {
    ImportedModel model = import_model(model_path, options);
    if (list) {
      fmt::print("{}", list_nodes(model, model_path, json));
      return 0;
    }
    ModelInfo facts = describe_model(model);
    fmt::print("{}", json ? versioned(tools::kInfoJsonVersion, to_json(facts)).dump() + "\n"
                          : render_text(facts));
    return 0;
  }
  if (out_dir.empty() && !dry_run) {
    fail(ErrorKind::kUsage,
         "nothing to do: give --info, -o PLAN_DIR to write a plan, or --dry-run");
  }
  if (profile_backend.empty() &&
      (app.count("--profile-db") > 0 || app.count("--profile-threads") > 0)) {
    fail(ErrorKind::kUsage, "--profile-db and --profile-threads need --profile cpu or cuda");
  }
  if (!profile_backend.empty() && profile_backend != "cpu" && profile_backend != "cuda") {
    fail(ErrorKind::kUsage, "--profile '{}' is not a backend; use --profile cpu or cuda",
         profile_backend);
  }
  if (!profile_backend.empty()) use_profile(app, po, profile_backend, profile_db, profile_threads);
  if ((po.loss.axis || po.loss.ignore_index) && (!po.training || po.loss.kind != "cross-entropy"))
    fail(ErrorKind::kUsage, "{} only for --train --loss cross-entropy",
         po.loss.axis ? "--loss-axis is" : "--ignore-index is");
  po.model_path = model_path;
  po.batch = batch;
  po.dims = options.dims;
  auto start = std::chrono::steady_clock::now();
  plan::PlannedModel planned = choice_names.search
                                   ? plan::auto_plan(po, auto_fixed(app, po), auto_progress())
                                   : plan::make_plan(po);
  if (!dry_run) plan::check_has_loss(planned.plan);  // before a plan summary it would not write
  double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  print_planner_notes(planned);
  fmt::print("{}", plan::describe_auto_search(planned.plan));
  fmt::print("{}", plan::summarize(planned.plan));
  fmt::print("{}",
             describe_instruction_costs(planned.instruction_costs, planned.plan.predicted.step_ms));
  if (dry_run) {
    fmt::print("planned in {:.2f} s (dry run: nothing written)\n", plan_s);
    return 0;
  }
  // stagerun must be able to run every op of the stage files it is given.
  check_backend_supports(planned.model.graph, rt::backend_by_name("cpu"));
  const double write_s = write_with_progress(planned, out_dir, weight_writing);
  fmt::print("planned in {:.2f} s; wrote {} in {:.2f} s (inspect with: stagedump {})\n", plan_s,
             out_dir, write_s, out_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return stagecraft::run_main("stagec", [&] { return run(argc, argv); });
}
