// The plan format's validator: every cross reference of a plan (stages, devices, interfaces,
// shared weights, ops, predictions) checked after reading and before writing, each fault one
// line naming the field and the numbers.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "runtime/format/checked.h"
#include "runtime/format/dtype.h"
#include "runtime/format/error.h"
#include "runtime/format/plan.h"
#include "runtime/format/processors.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::plan {
namespace {

/// The most devices (all replicas together) a plan may name.
constexpr int64_t kMaxDevices = 1 << 16;

/// "1 device", "2 devices"; `plural` when adding an "s" will not do.
std::string count(size_t n, std::string_view noun, std::string_view plural = "") {
  if (n == 1) return fmt::format("1 {}", noun);
  return plural.empty() ? fmt::format("{} {}s", n, noun) : fmt::format("{} {}", n, plural);
}

/// Checks one plan, throwing `Error(kPlan)` at the first fault with the field and the numbers.
class Validator {
 public:
  Validator(const Plan& plan, const std::string& source) : plan_(plan), source_(source) {}

  void run() {
    check_header();
    check_device();
    check_stage_list();
    for (const Stage& stage : plan_.stages) check_stage(stage);
    for (const Stage& stage : plan_.stages) check_interfaces(stage);
    for (const Stage& stage : plan_.stages) check_shared(stage);
    for (const Stage& stage : plan_.stages) check_shards(stage);
    check_weight_files();
    check_ops();
    check_prediction(plan_.predicted, "predicted");
    check_prediction(plan_.baseline_parameters, "baseline_parameters");
    check_prediction(plan_.baseline_uniform, "baseline_uniform");
    check_device_memory();
    check_search();
    check_timeline();
    check_processors(plan_, source_);
    check_auto_search(plan_, source_);
  }

 private:
  [[noreturn]] void fault(const std::string& field, const std::string& problem) const {
    throw Error(ErrorKind::kPlan, fmt::format("field '{}' {}", field, problem)).in(source_);
  }

  template <typename Names>
  void check_name(const std::string& field, const std::string& value, const Names& valid) const {
    for (std::string_view name : valid) {
      if (name == value) return;
    }
    fault(field, fmt::format("is '{}'; valid: {}", value, fmt::join(valid, ", ")));
  }

  void check_hash(const std::string& field, const std::string& hash,
                  std::string_view prefix = kHashPrefix) const {
    if (hash.empty()) return;
    bool ok = hash.size() == prefix.size() + 16 && hash.starts_with(prefix) &&
              hash.find_first_not_of("0123456789abcdef", prefix.size()) == std::string::npos;
    if (!ok) fault(field, fmt::format("is '{}', not \"{}<16 hex digits>\" or \"\"", hash, prefix));
  }

  /// The model's external-data files: each named once, by a relative location under
  /// "model_weights/" that stays inside it, and found at an absolute path.
  void check_weight_files() const {
    for (size_t i = 0; i < plan_.weight_files.size(); ++i) {
      const WeightFile& w = plan_.weight_files[i];
      const std::string at = fmt::format("weight_files[{}].", i);
      bool inside = w.location.starts_with("model_weights/") && w.location.find('\\') > w.location.size();
      for (size_t start = 0, end = 0; inside && start <= w.location.size(); start = end + 1) {
        end = std::min(w.location.find('/', start), w.location.size());
        const std::string_view part = std::string_view(w.location).substr(start, end - start);
        inside = !part.empty() && part != "." && part != "..";
      }
      if (!inside)
        fault(at + "location", fmt::format("is '{}'; it must be a relative name under "
                                           "'model_weights/' without '.' or '..' parts", w.location));
      for (size_t j = 0; j < i; ++j)
        if (plan_.weight_files[j].location == w.location)
          fault(at + "location", fmt::format("is '{}', the location of weight_files[{}] too",
                                             w.location, j));
      if (w.path.empty() || w.path.front() != '/')
        fault(at + "path", fmt::format("is '{}'; it must be an absolute path", w.path));
      non_negative(at + "bytes", static_cast<double>(w.bytes));
    }
  }

  void non_negative(const std::string& field, double value) const {
    if (std::isfinite(value) && value >= 0) return;
    fault(field, fmt::format("is {}; it must be >= 0", value));
  }

  void positive(const std::string& field, double value) const {
    if (std::isfinite(value) && value > 0) return;
    fault(field, fmt::format("is {}; it must be > 0", value));
  }

  void at_least_one(const std::string& field, int64_t value) const {
    if (value < 1) fault(field, fmt::format("is {}; it must be >= 1", value));
  }

  void check_header() const {
    check_format_version(plan_.format_version, source_);
    check_hash("model_hash", plan_.model_hash);
    at_least_one("devices", plan_.devices);
    at_least_one("chunks", plan_.chunks);
    at_least_one("microbatches", plan_.microbatches);
    at_least_one("microbatch_size", plan_.microbatch_size);
    at_least_one("data_parallel", plan_.data_parallel);
    // Every device of every replica is a thread or a rank: a bound far above any machine's.
    if (static_cast<int64_t>(plan_.devices) * plan_.data_parallel > kMaxDevices) {
      fault("data_parallel", fmt::format("is {}; x {} devices is more than {} devices in all",
                                         plan_.data_parallel, plan_.devices, kMaxDevices));
    }
    check_placement();
    const std::optional<int64_t> replica_batch = try_mul(plan_.microbatches, plan_.microbatch_size);
    const std::optional<int64_t> batch =
        replica_batch ? try_mul(*replica_batch, plan_.data_parallel) : std::nullopt;
    if (!batch) {
      fault("microbatch_size",
            fmt::format("is {}; x {} microbatches x {} replicas overflows int64",
                        plan_.microbatch_size, plan_.microbatches, plan_.data_parallel));
    }
    if (plan_.batch != *batch && plan_.data_parallel == 1) {
      fault("batch", fmt::format("is {}, but microbatches x microbatch_size is {} x {} = {}",
                                 plan_.batch, plan_.microbatches, plan_.microbatch_size, *batch));
    }
    if (plan_.batch != *batch) {
      fault("batch", fmt::format("is {}, but data_parallel x microbatches x microbatch_size is {} "
                                 "x {} x {} = {}",
                                 plan_.batch, plan_.data_parallel, plan_.microbatches,
                                 plan_.microbatch_size, *batch));
    }
    // A custom schedule (--schedule-csv): any chunks; validate_schedule checks its order.
    const bool custom = plan_.schedule == ScheduleKind::kCustom;
    if (const int fixed = schedule::fixed_chunks(plan_.schedule); fixed && plan_.chunks != fixed)
      fault("chunks", fmt::format("is {}, but schedule '{}' runs {} per device", plan_.chunks,
                                  to_string(plan_.schedule), count(fixed, "chunk")));
    if (plan_.schedule == ScheduleKind::kInterleaved && plan_.microbatches % plan_.devices != 0)
      fault("microbatches", fmt::format("is {}, but the interleaved schedule needs a multiple of "
                                        "the {} devices", plan_.microbatches, plan_.devices));
    if (plan_.schedule == ScheduleKind::kDualPipeV && plan_.microbatches / 2 < plan_.devices)
      fault("microbatches", fmt::format("is {}, but schedule 'dualpipev' needs at least twice the "
                                        "{} devices", plan_.microbatches, plan_.devices));
    if (!custom && plan_.training == (plan_.schedule == ScheduleKind::kInference)) {
      fault("training", fmt::format("is {}, but the schedule is '{}'", plan_.training,
                                    to_string(plan_.schedule)));
    }
    if (plan_.shard_optimizer && (!plan_.training || plan_.data_parallel < 2)) {
      fault("shard_optimizer",
            fmt::format("is true, but the plan {}: sharding the optimizer state needs training "
                        "with 2 or more data-parallel replicas",
                        !plan_.training ? "is for inference"
                                        : fmt::format("has data_parallel {}", plan_.data_parallel)));
    }
  }

  /// ZeRO-1's shards of a stage: R + 1 boundaries from 0, never decreasing, within the stage's
  /// parameters; none without sharding.
  // Every device of every replica on its own rank: a permutation of 0 .. R x P - 1 (after the
  // device count is known to be bounded).
  void check_placement() const {
    const int64_t devices = static_cast<int64_t>(plan_.devices) * plan_.data_parallel;
    if (static_cast<int64_t>(plan_.placement.size()) != devices) {
      fault("placement", fmt::format("has {} ranks for {} devices ({} replicas x {})",
                                     plan_.placement.size(), devices, plan_.data_parallel,
                                     plan_.devices));
    }
    std::vector<bool> taken(static_cast<size_t>(devices), false);
    for (size_t g = 0; g < plan_.placement.size(); ++g) {
      const int rank = plan_.placement[g];
      if (rank < 0 || rank >= devices)
        fault(fmt::format("placement[{}]", g),
              fmt::format("is rank {}; the ranks are 0 to {}", rank, devices - 1));
      if (taken[static_cast<size_t>(rank)])
        fault(fmt::format("placement[{}]", g),
              fmt::format("is rank {}, which runs another device too", rank));
      taken[static_cast<size_t>(rank)] = true;
    }
  }

  void check_shards(const Stage& stage) const {
    const std::string field = fmt::format("stages[{}].optimizer_shards", stage.index);
    non_negative(fmt::format("stages[{}].allgather_ms", stage.index), stage.allgather_ms);
    const std::vector<int64_t>& bounds = stage.optimizer_shards;
    if (!plan_.shard_optimizer) {
      if (!bounds.empty())
        fault(field, fmt::format("lists {}, but shard_optimizer is false",
                                 count(bounds.size(), "boundary", "boundaries")));
      if (stage.allgather_ms != 0)
        fault(fmt::format("stages[{}].allgather_ms", stage.index),
              fmt::format("is {}, but shard_optimizer is false", stage.allgather_ms));
      return;
    }
    const size_t want = static_cast<size_t>(plan_.data_parallel) + 1;
    if (bounds.size() != want)
      fault(field, fmt::format("lists {}; {} replicas need {} (one shard each)",
                               count(bounds.size(), "boundary", "boundaries"),
                               plan_.data_parallel, want));
    if (bounds.front() != 0)
      fault(field + "[0]", fmt::format("is {}; the first shard starts at 0", bounds.front()));
    for (size_t r = 1; r < bounds.size(); ++r)
      if (bounds[r] < bounds[r - 1])
        fault(fmt::format("{}[{}]", field, r),
              fmt::format("is {}, less than the boundary before it ({}): shards are contiguous "
                          "and in replica order",
                          bounds[r], bounds[r - 1]));
    if (bounds.back() > stage.params)
      fault(fmt::format("{}[{}]", field, bounds.size() - 1),
            fmt::format("is {}, more than the stage's {} parameters", bounds.back(), stage.params));
  }

  /// The device: named, a known kind, a capacity; the cluster's numbers positive.
  void check_device() const {
    const DeviceSpec& device = plan_.device;
    if (device.name.empty()) fault("device.name", "is empty");
    at_least_one("device.memory_bytes", device.memory_bytes);
    const ClusterSpec& cluster = plan_.cluster;
    at_least_one("cluster.devices_per_node", cluster.devices_per_node);
    for (auto [name, link] : {std::pair{"intra_node", cluster.intra_node},
                              std::pair{"inter_node", cluster.inter_node}}) {
      positive(fmt::format("cluster.{}.bandwidth", name), link.bandwidth);
      non_negative(fmt::format("cluster.{}.latency_s", name), link.latency_s);
    }
  }

  /// A training stage's B and W add up to its backward; an inference stage has neither, nor an
  /// optimizer step.
  void check_stage_times(const Stage& stage, const std::string& at) const {
    non_negative(at + "backward_input_ms", stage.backward_input_ms);
    non_negative(at + "backward_weight_ms", stage.backward_weight_ms);
    non_negative(at + "optimizer_ms", stage.optimizer_ms);
    double parts = stage.backward_input_ms + stage.backward_weight_ms;
    if (std::abs(parts - stage.bwd_ms) > 1e-6 * std::max(1.0, stage.bwd_ms)) {
      fault(at + "bwd_ms",
            fmt::format("is {}, but backward_input_ms + backward_weight_ms is {} + "
                        "{} = {}",
                        stage.bwd_ms, stage.backward_input_ms, stage.backward_weight_ms, parts));
    }
    if (!plan_.training && stage.optimizer_ms != 0) {
      fault(at + "optimizer_ms",
            fmt::format("is {}, but an inference plan has no optimizer step", stage.optimizer_ms));
    }
  }

  void check_stage_list() const {
    size_t expected = static_cast<size_t>(plan_.devices) * plan_.chunks;
    if (plan_.stages.size() != expected) {
      fault("stages", fmt::format("has {}, but devices x chunks is {} x {} = {}",
                                  count(plan_.stages.size(), "stage"), plan_.devices, plan_.chunks,
                                  expected));
    }
  }

  void check_stage(const Stage& stage) {
    int k = static_cast<int>(&stage - plan_.stages.data());
    std::string at = fmt::format("stages[{}].", k);
    if (stage.index != k) {
      fault(at + "index", fmt::format("is {}; stages are listed in order", stage.index));
    }
    if (stage.device < 0 || stage.device >= plan_.devices) {
      fault(at + "device", fmt::format("is {}, but the plan has {} (0..{})", stage.device,
                                       count(plan_.devices, "device"), plan_.devices - 1));
    }
    if (stage.device != home(k)) {
      fault(at + "device",
            fmt::format("is {}, but stage {} belongs on device {} ('{}' on {})", stage.device, k,
                        home(k), to_string(plan_.schedule), count(plan_.devices, "device")));
    }
    if (stage.chunk != k / plan_.devices) {
      fault(at + "chunk", fmt::format("is {}, but stage {} is chunk {} of its device (k / {})",
                                      stage.chunk, k, k / plan_.devices, plan_.devices));
    }
    if (stage.file.empty() || stage.file == "." || stage.file == ".." ||
        stage.file.find_first_of("/\\") != std::string::npos) {
      fault(at + "file",
            fmt::format("is '{}'; it must be a file name inside the plan directory", stage.file));
    }
    for (int other = 0; other < k; ++other) {
      if (plan_.stages[other].file == stage.file) {
        fault(at + "file", fmt::format("is '{}', the file of stage {} too", stage.file, other));
      }
    }
    check_hash(at + "file_hash", stage.file_hash);
    non_negative(at + "weights_bytes", static_cast<double>(stage.weights_bytes));
    check_hash(at + "weights_hash", stage.weights_hash, "fnv1a64x4:");
    if (stage.nodes.empty()) fault(at + "nodes", "is empty; every stage needs at least one node");
    for (size_t i = 0; i < stage.nodes.size(); ++i) {
      const std::string& node = stage.nodes[i];
      std::string field = fmt::format("{}nodes[{}]", at, i);
      if (node.empty()) fault(field, "is an empty node name");
      auto [it, inserted] = node_stage_.emplace(node, std::make_pair(k, i));
      if (!inserted) {
        fault(field,
              fmt::format("names node '{}', which is already in stage {} (stages[{}].nodes[{}])",
                          node, it->second.first, it->second.first, it->second.second));
      }
    }
    non_negative(at + "params", static_cast<double>(stage.params));
    non_negative(at + "fwd_ms", stage.fwd_ms);
    non_negative(at + "bwd_ms", stage.bwd_ms);
    check_stage_times(stage, at);
    non_negative(at + "send_ms", stage.send_ms);
    at_least_one(at + "in_flight", stage.in_flight);
    non_negative(at + "arena.bytes", static_cast<double>(stage.arena_bytes));
    non_negative(at + "backward_arena_bytes", static_cast<double>(stage.backward_arena_bytes));
    for (size_t t = 0; t < stage.arena.size(); ++t) {
      const ArenaTensor& a = stage.arena[t];
      // offset + bytes is never formed before both are known to fit (a hostile offset near
      // 2^63 would wrap it negative and pass).
      if (a.offset < 0 || a.bytes < 0 || stage.arena_bytes < 0 ||
          a.offset > stage.arena_bytes - a.bytes)
        fault(fmt::format("{}arena.tensors[{}]", at, t),
              fmt::format("places '{}' at offset {} ({} bytes), outside the {}-byte arena", a.name,
                          a.offset, a.bytes, stage.arena_bytes));
    }
    const MemoryBytes& m = stage.memory;
    for (auto [name, bytes] : {std::pair{"weights", m.weights},
                               {"gradients", m.gradients},
                               {"optimizer", m.optimizer},
                               {"activations", m.activations},
                               {"temporary", m.temporary},
                               {"communication", m.communication}}) {
      non_negative(at + "memory." + name, static_cast<double>(bytes));
    }
    check_tensors(stage.inputs, at + "inputs");
    check_tensors(stage.outputs, at + "outputs");
  }

  /// Names unique within a list, dtypes known, dims and bytes non-negative.
  void check_tensors(const std::vector<StageTensor>& tensors, const std::string& at) const {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const StageTensor& tensor = tensors[i];
      std::string field = fmt::format("{}[{}]", at, i);
      if (tensor.name.empty()) fault(field + ".name", "is empty");
      for (size_t j = 0; j < i; ++j) {
        if (tensors[j].name == tensor.name) {
          fault(field + ".name",
                fmt::format("is '{}', listed already as {}[{}]", tensor.name, at, j));
        }
      }
      if (!dtype_from_name(tensor.dtype) || dtype_size(*dtype_from_name(tensor.dtype)) == 0) {
        fault(field + ".dtype", fmt::format("is '{}', not a tensor dtype", tensor.dtype));
      }
      for (size_t d = 0; d < tensor.shape.size(); ++d) {
        if (tensor.shape[d] < 0) {
          fault(fmt::format("{}.shape[{}]", field, d),
                fmt::format("is {}; dims are >= 0", tensor.shape[d]));
        }
      }
      non_negative(field + ".bytes", static_cast<double>(tensor.bytes));
    }
  }

  static const StageTensor* find(const std::vector<StageTensor>& tensors, const std::string& name) {
    for (const StageTensor& tensor : tensors) {
      if (tensor.name == name) return &tensor;
    }
    return nullptr;
  }

  /// Every input's producer writes it alike and lists this stage; every output is read.
  void check_interfaces(const Stage& stage) const {
    int k = stage.index;
    int stages = static_cast<int>(plan_.stages.size());
    for (size_t i = 0; i < stage.inputs.size(); ++i) {
      const StageTensor& input = stage.inputs[i];
      std::string field = fmt::format("stages[{}].inputs[{}]", k, i);
      if (input.peer_stage == -1) continue;
      if (input.peer_stage < 0 || input.peer_stage >= k) {
        fault(field + ".peer_stage",
              fmt::format(
                  "is {}; an input comes from an earlier stage (0..{}) or is a graph input (-1)",
                  input.peer_stage, k - 1));
      }
      const Stage& producer = plan_.stages[input.peer_stage];
      const StageTensor* output = find(producer.outputs, input.name);
      if (!output) {
        fault(field, fmt::format("reads '{}' from stage {}, whose outputs do not include it",
                                 input.name, producer.index));
      }
      if (output->dtype != input.dtype) {
        fault(field + ".dtype", fmt::format("is {}, but stage {} writes '{}' as {}", input.dtype,
                                            producer.index, input.name, output->dtype));
      }
      if (output->shape != input.shape) {
        fault(field + ".shape",
              fmt::format("is [{}], but stage {} writes '{}' as [{}]", fmt::join(input.shape, ","),
                          producer.index, input.name, fmt::join(output->shape, ",")));
      }
      if (output->bytes != input.bytes) {
        fault(field + ".bytes",
              fmt::format("is {}, but stage {} writes '{}' as {} bytes", input.bytes,
                          producer.index, input.name, output->bytes));
      }
      if (std::find(output->peer_stages.begin(), output->peer_stages.end(), k) ==
          output->peer_stages.end()) {
        fault(field, fmt::format("reads '{}' from stage {}, whose output does not list stage {} in "
                                 "its peer_stages",
                                 input.name, producer.index, k));
      }
    }
    for (size_t o = 0; o < stage.outputs.size(); ++o) {
      const StageTensor& output = stage.outputs[o];
      std::string field = fmt::format("stages[{}].outputs[{}]", k, o);
      if (output.peer_stages.empty() && !output.graph_output) {
        fault(field,
              fmt::format("('{}') is read by no stage and is not a graph output", output.name));
      }
      for (size_t p = 0; p < output.peer_stages.size(); ++p) {
        int peer = output.peer_stages[p];
        std::string peer_field = fmt::format("{}.peer_stages[{}]", field, p);
        if (peer <= k || peer >= stages) {
          fault(peer_field,
                fmt::format("is {}; a reader is a later stage ({}..{})", peer, k + 1, stages - 1));
        }
        if (p > 0 && peer <= output.peer_stages[p - 1]) {
          fault(peer_field,
                fmt::format("is {}; peer_stages are listed in ascending order, once each", peer));
        }
        const StageTensor* input = find(plan_.stages[peer].inputs, output.name);
        if (!input || input->peer_stage != k) {
          fault(peer_field,
                fmt::format("names stage {}, but stage {} has no input '{}' from stage {}", peer,
                            peer, output.name, k));
        }
      }
    }
  }

  /// Every shared weight: a known dtype, dims >= 0, two or more holders in range and ascending,
  /// this stage among them, and each other holder listing it with the same dtype, shape and
  /// holders.
  void check_shared(const Stage& stage) const {
    int k = stage.index;
    int stages = static_cast<int>(plan_.stages.size());
    non_negative(fmt::format("stages[{}].shared_exchange_ms", k), stage.shared_exchange_ms);
    for (size_t i = 0; i < stage.shared_weights.size(); ++i) {
      const SharedWeight& w = stage.shared_weights[i];
      std::string field = fmt::format("stages[{}].shared_weights[{}]", k, i);
      if (w.name.empty()) fault(field + ".name", "is empty");
      for (size_t j = 0; j < i; ++j)
        if (stage.shared_weights[j].name == w.name)
          fault(field + ".name",
                fmt::format("is '{}', listed already as shared_weights[{}]", w.name, j));
      if (!dtype_from_name(w.dtype) || dtype_size(*dtype_from_name(w.dtype)) == 0)
        fault(field + ".dtype", fmt::format("is '{}', not a tensor dtype", w.dtype));
      for (size_t d = 0; d < w.shape.size(); ++d)
        if (w.shape[d] < 0)
          fault(fmt::format("{}.shape[{}]", field, d),
                fmt::format("is {}; dims are >= 0", w.shape[d]));
      if (w.stages.size() < 2)
        fault(field + ".stages", fmt::format("lists {} for '{}'; a shared weight has two or more",
                                             count(w.stages.size(), "stage"), w.name));
      for (size_t p = 0; p < w.stages.size(); ++p) {
        std::string at = fmt::format("{}.stages[{}]", field, p);
        if (w.stages[p] < 0 || w.stages[p] >= stages)
          fault(at, fmt::format("is {}, but the plan has {} (0..{})", w.stages[p],
                                count(stages, "stage"), stages - 1));
        if (p > 0 && w.stages[p] <= w.stages[p - 1])
          fault(at, fmt::format("is {}; holders are listed in ascending order, once each",
                                w.stages[p]));
      }
      if (std::find(w.stages.begin(), w.stages.end(), k) == w.stages.end())
        fault(field + ".stages", fmt::format("are [{}] for '{}', without stage {} that lists it",
                                             fmt::join(w.stages, ","), w.name, k));
      for (int holder : w.stages) {
        if (holder == k) continue;
        const std::vector<SharedWeight>& theirs = plan_.stages[holder].shared_weights;
        auto other = std::find_if(theirs.begin(), theirs.end(),
                                  [&](const SharedWeight& x) { return x.name == w.name; });
        if (other == theirs.end())
          fault(field + ".stages",
                fmt::format("name stage {} as a holder of '{}', but stages[{}].shared_weights "
                            "does not list it",
                            holder, w.name, holder));
        if (other->dtype != w.dtype)
          fault(field + ".dtype", fmt::format("is {}, but stage {} holds '{}' as {}", w.dtype,
                                              holder, w.name, other->dtype));
        if (other->shape != w.shape)
          fault(field + ".shape",
                fmt::format("is [{}], but stage {} holds '{}' as [{}]", fmt::join(w.shape, ","),
                            holder, w.name, fmt::join(other->shape, ",")));
        if (other->stages != w.stages)
          fault(
              field + ".stages",
              fmt::format("are [{}], but stage {} lists the holders of '{}' as [{}]",
                          fmt::join(w.stages, ","), holder, w.name, fmt::join(other->stages, ",")));
      }
    }
  }

  void check_ops() const {
    int stages = static_cast<int>(plan_.stages.size());
    std::unordered_map<std::string, size_t> seen;
    for (size_t i = 0; i < plan_.ops.size(); ++i) {
      const OpRecord& op = plan_.ops[i];
      std::string at = fmt::format("ops[{}].", i);
      if (op.stage < 0 || op.stage >= stages) {
        fault(at + "stage", fmt::format("is {}, but the plan has {} (0..{})", op.stage,
                                        count(stages, "stage"), stages - 1));
      }
      auto node = node_stage_.find(op.name);
      if (node == node_stage_.end()) {
        fault(at + "name", fmt::format("is '{}', a node no stage lists", op.name));
      }
      if (node->second.first != op.stage) {
        fault(at + "stage", fmt::format("is {}, but node '{}' is in stage {}", op.stage, op.name,
                                        node->second.first));
      }
      auto [previous, inserted] = seen.emplace(op.name, i);
      if (!inserted) {
        fault(at + "name",
              fmt::format("is '{}', listed already as ops[{}]", op.name, previous->second));
      }
      non_negative(at + "fwd_ms", op.fwd_ms);
      non_negative(at + "bwd_ms", op.bwd_ms);
      non_negative(at + "flops", op.flops);
      non_negative(at + "param_bytes", static_cast<double>(op.param_bytes));
      non_negative(at + "output_bytes", static_cast<double>(op.output_bytes));
    }
  }

  /// The one memory figure per device: its parts add up to it, the static parts and buffers are
  /// its stages', it is the prediction's device peak, and the memory over the step reaches it.
  void check_device_memory() const {
    const size_t devices = plan_.devices;
    if (plan_.device_memory.size() != devices) {
      fault("device_memory", fmt::format("has {}, but the plan has {}",
                                         count(plan_.device_memory.size(), "entry", "entries"),
                                         count(devices, "device")));
    }
    const std::vector<int64_t>& peaks = plan_.predicted.device_peak_bytes;
    if (peaks.size() != devices) {
      fault("predicted.device_peak_bytes",
            fmt::format("has {}, but the plan has {}", count(peaks.size(), "entry", "entries"),
                        count(devices, "device")));
    }
    std::vector<PeakParts> own(devices);
    for (const Stage& stage : plan_.stages) {
      PeakParts& p = own[stage.device];
      p.weights += stage.memory.weights;
      p.gradients += stage.memory.gradients;
      p.optimizer += stage.memory.optimizer;
      p.communication += stage.memory.communication;
      p.arena = std::max(p.arena, stage.memory.temporary);
    }
    int64_t largest = 0;
    for (size_t d = 0; d < devices; ++d) {
      const DevicePeak& device = plan_.device_memory[d];
      const std::string at = fmt::format("device_memory[{}].", d);
      if (device.device != static_cast<int>(d)) {
        fault(at + "device", fmt::format("is {}; entries are in device order", device.device));
      }
      const PeakParts& p = device.parts;
      for (auto [name, bytes] : {std::pair<const char*, int64_t>{"weights", p.weights},
                                 {"gradients", p.gradients},
                                 {"optimizer", p.optimizer},
                                 {"activations", p.activations},
                                 {"recomputed", p.recomputed},
                                 {"deferred", p.deferred},
                                 {"arena", p.arena},
                                 {"communication", p.communication}})
        non_negative(at + "parts." + name, static_cast<double>(bytes));
      for (auto [name, bytes, stages] :
           {std::tuple<const char*, int64_t, int64_t>{"weights", p.weights, own[d].weights},
            {"gradients", p.gradients, own[d].gradients},
            {"optimizer", p.optimizer, own[d].optimizer},
            {"communication", p.communication, own[d].communication}}) {
        if (bytes != stages)
          fault(at + "parts." + name,
                fmt::format("is {}, but the device's stages hold {} together", bytes, stages));
      }
      if (p.arena != own[d].arena)
        fault(at + "parts.arena", fmt::format("is {}, but the largest of the device's stages' "
                                              "temporary memory is {}",
                                              p.arena, own[d].arena));
      if (device.peak_bytes != p.total())
        fault(at + "peak_bytes",
              fmt::format("is {}, but its parts add up to {}", device.peak_bytes, p.total()));
      if (peaks[d] != device.peak_bytes)
        fault(fmt::format("predicted.device_peak_bytes[{}]", d),
              fmt::format("is {}, but device_memory[{}].peak_bytes is {}", peaks[d], d,
                          device.peak_bytes));
      non_negative(at + "peak_ms", device.peak_ms);
      non_negative(at + "in_flight", static_cast<double>(device.in_flight));
      if (device.time_ms.empty() || device.time_ms.size() != device.bytes.size())
        fault(at + "time_ms", fmt::format("has {} but bytes has {}; both need one entry per "
                                          "change, at least one",
                                          count(device.time_ms.size(), "entry", "entries"),
                                          count(device.bytes.size(), "entry", "entries")));
      for (size_t i = 0; i < device.time_ms.size(); ++i) {
        non_negative(fmt::format("{}time_ms[{}]", at, i), device.time_ms[i]);
        if (i > 0 && device.time_ms[i] < device.time_ms[i - 1])
          fault(fmt::format("{}time_ms[{}]", at, i),
                fmt::format("is {}, before the entry ahead of it ({})", device.time_ms[i],
                            device.time_ms[i - 1]));
      }
      const int64_t highest = *std::max_element(device.bytes.begin(), device.bytes.end());
      if (highest != device.peak_bytes)
        fault(at + "bytes",
              fmt::format("reach {} at most, but peak_bytes is {}", highest, device.peak_bytes));
      largest = std::max(largest, device.peak_bytes);
    }
    if (plan_.predicted.peak_memory_bytes != largest)
      fault("predicted.peak_memory_bytes", fmt::format("is {}, but the largest device peak is {}",
                                                       plan_.predicted.peak_memory_bytes, largest));
  }

  void check_prediction(const Prediction& prediction, const std::string& name) const {
    std::string at = name + ".";
    non_negative(at + "step_ms", prediction.step_ms);
    non_negative(at + "samples_per_s", prediction.samples_per_s);
    non_negative(at + "peak_memory_bytes", static_cast<double>(prediction.peak_memory_bytes));
    if (!(prediction.bubble_fraction >= 0 && prediction.bubble_fraction <= 1)) {
      fault(at + "bubble_fraction",
            fmt::format("is {}; it must lie in [0, 1]", prediction.bubble_fraction));
    }
    size_t devices = plan_.devices;
    if (!prediction.device_busy_ms.empty() && prediction.device_busy_ms.size() != devices) {
      fault(at + "device_busy_ms",
            fmt::format("has {}, but the plan has {}",
                        count(prediction.device_busy_ms.size(), "entry", "entries"),
                        count(devices, "device")));
    }
    if (!prediction.device_peak_bytes.empty() && prediction.device_peak_bytes.size() != devices) {
      fault(at + "device_peak_bytes",
            fmt::format("has {}, but the plan has {}",
                        count(prediction.device_peak_bytes.size(), "entry", "entries"),
                        count(devices, "device")));
    }
    for (size_t d = 0; d < prediction.device_busy_ms.size(); ++d) {
      non_negative(fmt::format("{}device_busy_ms[{}]", at, d), prediction.device_busy_ms[d]);
    }
    for (size_t d = 0; d < prediction.device_peak_bytes.size(); ++d) {
      non_negative(fmt::format("{}device_peak_bytes[{}]", at, d),
                   static_cast<double>(prediction.device_peak_bytes[d]));
    }
    size_t cuts = plan_.stages.size() - 1;
    if (!prediction.split_after.empty() && prediction.split_after.size() != cuts) {
      fault(at + "split_after",
            fmt::format("has {}, but {} have {}",
                        count(prediction.split_after.size(), "entry", "entries"),
                        count(plan_.stages.size(), "stage"), count(cuts, "cut")));
    }
    for (size_t c = 0; c < prediction.split_after.size(); ++c) {
      if (!node_stage_.contains(prediction.split_after[c])) {
        fault(fmt::format("{}split_after[{}]", at, c),
              fmt::format("is '{}', a node no stage lists", prediction.split_after[c]));
      }
    }
  }

  void check_search() const {
    const SplitSearch& search = plan_.search;
    non_negative("search.candidates", static_cast<double>(search.candidates));
    non_negative("search.pruned", static_cast<double>(search.pruned));
    non_negative("search.bottleneck_step_ms", search.bottleneck_step_ms);
    size_t cuts = plan_.stages.size() - 1;
    if (!search.bottleneck_split_after.empty() && search.bottleneck_split_after.size() != cuts) {
      fault("search.bottleneck_split_after",
            fmt::format("has {}, but {} have {}",
                        count(search.bottleneck_split_after.size(), "entry", "entries"),
                        count(plan_.stages.size(), "stage"), count(cuts, "cut")));
    }
    for (size_t c = 0; c < search.bottleneck_split_after.size(); ++c)
      if (!node_stage_.contains(search.bottleneck_split_after[c]))
        fault(fmt::format("search.bottleneck_split_after[{}]", c),
              fmt::format("is '{}', a node no stage lists", search.bottleneck_split_after[c]));
  }

  /// Every event on a device and stage of the plan, in time order within itself, and the last
  /// one ending when the predicted step does.
  void check_timeline() const {
    if (plan_.timeline.empty()) fault("timeline", "is empty; it lists the predicted step");
    const int stages = static_cast<int>(plan_.stages.size());
    double last_end = 0;
    for (size_t i = 0; i < plan_.timeline.size(); ++i) {
      const schedule::TimelineEvent& e = plan_.timeline[i];
      std::string at = fmt::format("timeline[{}].", i);
      if (e.device < 0 || e.device >= plan_.devices) {
        fault(at + "device", fmt::format("is {}, but the plan has {} (0..{})", e.device,
                                         count(plan_.devices, "device"), plan_.devices - 1));
      }
      if (e.stage < 0 || e.stage >= stages || home(e.stage) != e.device) {
        fault(at + "stage", fmt::format("is {}, not a stage of device {}", e.stage, e.device));
      }
      if (e.microbatch < -1 || e.microbatch >= plan_.microbatches) {
        fault(at + "microbatch",
              fmt::format("is {}; it lies in -1..{}", e.microbatch, plan_.microbatches - 1));
      }
      non_negative(at + "start_ms", e.start_s);
      if (!(e.end_s >= e.start_s)) {
        fault(at + "end_ms",
              fmt::format("is {}, before its start_ms {}", e.end_s * 1e3, e.start_s * 1e3));
      }
      last_end = std::max(last_end, e.end_s * 1e3);
    }
    // A calibrated plan's step lasts beyond its last instruction (instruction_costs).
    const double step = plan_.predicted.step_ms, beyond = plan_.step_overhead_ms;
    if (std::abs(last_end + beyond - step) > 1e-6 * std::max(1.0, step))
      fault("timeline", fmt::format("ends at {} ms, which with instruction_costs.step_overhead_ms "
                                    "{} is not predicted.step_ms {}", last_end, beyond, step));
  }

  const Plan& plan_;
  const std::string& source_;
  int home(int k) const { return schedule::device_of_stage(k, plan_.devices, plan_.schedule); }
  /// Node name -> (stage, position in its node list), filled by check_stage.
  std::unordered_map<std::string, std::pair<int, size_t>> node_stage_;
};
}  // namespace

void validate_plan(const Plan& plan, const std::string& source) { Validator(plan, source).run(); }

void check_fits(const Plan& plan, int64_t capacity_bytes, std::string_view capacity_name,
                const std::string& source) {
  check_fits(
      plan,
      [&](int device) {
        return Capacity{device, capacity_bytes, std::string(capacity_name)};
      },
      source);
}

void check_fits(const Plan& plan, const std::function<Capacity(int device)>& capacity_of,
                const std::string& source) {
  struct Use {
    Capacity capacity;
    int64_t bytes = 0;
    std::vector<int> devices;
  };
  std::map<int, Use> uses;  // by physical device
  // Every replica's devices peak as the first replica's (the predictions are per pipeline
  // device): device g of R x P holds what pipeline device g % P does.
  const std::vector<int64_t>& peaks = plan.predicted.device_peak_bytes;
  const size_t all = peaks.size() * static_cast<size_t>(std::max(plan.data_parallel, 1));
  for (size_t g = 0; g < all; ++g) {
    const int64_t peak = peaks[g % peaks.size()];
    Capacity c = capacity_of(static_cast<int>(g));
    Use& use = uses[c.index];
    use.capacity = c;
    // Saturating: a hostile peak must not wrap the sum below the capacity.
    use.bytes = peak > std::numeric_limits<int64_t>::max() - use.bytes
                    ? std::numeric_limits<int64_t>::max()
                    : use.bytes + peak;
    use.devices.push_back(static_cast<int>(g));
  }
  for (const auto& [index, use] : uses) {
    if (use.bytes <= use.capacity.bytes) continue;
    std::string who =
        use.devices.size() == 1
            ? fmt::format("device {} is predicted to peak at {} bytes", use.devices[0], use.bytes)
            : fmt::format("devices {} share it and are predicted to peak at {} bytes together",
                          fmt::join(use.devices, ", "), use.bytes);
    throw Error(ErrorKind::kPlan,
                fmt::format("{}, more than the {} bytes of {} (the plan was made for {} with {} "
                            "bytes per device)",
                            who, use.capacity.bytes, use.capacity.name, plan.device.name,
                            plan.device.memory_bytes))
        .in(source);
  }
}

std::vector<std::vector<int>> shared_weight_groups(const std::vector<SharedWeight>& weights) {
  std::vector<std::vector<int>> groups;
  for (const SharedWeight& w : weights)
    if (std::find(groups.begin(), groups.end(), w.stages) == groups.end())
      groups.push_back(w.stages);
  std::sort(groups.begin(), groups.end());
  return groups;
}

std::vector<std::vector<int>> shared_weight_groups(const Plan& plan) {
  std::vector<SharedWeight> all;
  for (const Stage& stage : plan.stages)
    all.insert(all.end(), stage.shared_weights.begin(), stage.shared_weights.end());
  return shared_weight_groups(all);
}

}  // namespace stagecraft::plan
