// The plan format: plan.json written and read field by field, a validator for every cross
// reference, and the loader that checks the stage files against their recorded hashes.
//
// Reading is strict: every field of plan.h is required, an unknown field is refused (a misspelt
// one would otherwise read as a default), and each error names the file and the field path
// ("stages[2].inputs[0].shape[1]"). The free-form `device_spec` and `cluster` objects are kept
// as they are; cost_models owns their schema.
#include "runtime/format/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <memory>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "runtime/format/dtype.h"
#include "runtime/format/error.h"

namespace stagecraft::plan {
namespace {

namespace fs = std::filesystem;
using ordered = nlohmann::ordered_json;

// The names a plan may use. The compiler's enums (cost_models, compiler/schedule) spell them the
// same way; they are repeated here because the format must not depend on the compiler.
constexpr std::array<std::string_view, 2> kObjectives = {"speed", "memory"};
constexpr std::array<std::string_view, 5> kSchedules = {"gpipe", "1f1b", "interleaved", "zb-h1",
                                                        "inference"};
constexpr std::array<std::string_view, 2> kPrecisions = {"fp32", "mixed"};
constexpr std::array<std::string_view, 8> kOptimizers = {"none", "sgd",   "momentum", "nesterov",
                                                         "adam", "adamw", "adam8bit", "adagrad"};
constexpr std::string_view kHashPrefix = "fnv1a64:";

/// "1 device", "2 devices"; `plural` when adding an "s" will not do.
std::string count(size_t n, std::string_view noun, std::string_view plural = "") {
  if (n == 1) return fmt::format("1 {}", noun);
  return plural.empty() ? fmt::format("{} {}s", n, noun) : fmt::format("{} {}", n, plural);
}

/// Refuses another format version: `Error(kUnsupported)` naming both.
void check_version(int version, const std::string& source) {
  if (version == kPlanFormatVersion) return;
  throw Error(ErrorKind::kUnsupported,
              fmt::format("field 'format_version' is {}; this build reads version {}", version,
                          kPlanFormatVersion))
      .in(source);
}

/// The error for a file that cannot be opened, with the system's reason.
Error cannot_open(const std::string& path) {
  return Error(ErrorKind::kIo, fmt::format("cannot open ({})", std::strerror(errno))).in(path);
}

// ---------------------------------------------------------------------------------------------
// Writing

ordered memory_json(const MemoryBytes& memory) {
  return {{"weights", memory.weights},     {"gradients", memory.gradients},
          {"optimizer", memory.optimizer}, {"activations", memory.activations},
          {"temporary", memory.temporary}, {"communication", memory.communication},
          {"total", memory.total()}};
}

/// Inputs carry `peer_stage`; outputs carry `peer_stages` and `graph_output`.
ordered tensor_json(const StageTensor& tensor, bool is_input) {
  ordered json = {{"name", tensor.name}, {"dtype", tensor.dtype}, {"shape", tensor.shape}};
  if (is_input) {
    json["peer_stage"] = tensor.peer_stage;
  } else {
    json["peer_stages"] = tensor.peer_stages;
    json["graph_output"] = tensor.graph_output;
  }
  json["bytes"] = tensor.bytes;
  return json;
}

ordered tensors_json(const std::vector<StageTensor>& tensors, bool is_input) {
  ordered list = ordered::array();
  for (const StageTensor& tensor : tensors) list.push_back(tensor_json(tensor, is_input));
  return list;
}

ordered training_json(const TrainingConfig& c) {
  return {{"loss", c.loss},         {"loss_output", c.loss_output}, {"labels", c.labels},
          {"lr", c.lr},             {"weight_decay", c.weight_decay}, {"momentum", c.momentum},
          {"beta1", c.beta1},       {"beta2", c.beta2},             {"epsilon", c.epsilon},
          {"lr_schedule", c.lr_schedule}, {"warmup_steps", c.warmup_steps}, {"total_steps", c.total_steps}};
}

ordered arena_json(const Stage& stage) {
  ordered tensors = ordered::array();
  for (const ArenaTensor& t : stage.arena)
    tensors.push_back({{"name", t.name}, {"offset", t.offset}, {"bytes", t.bytes}});
  return {{"bytes", stage.arena_bytes}, {"tensors", tensors}};
}

ordered shared_json(const std::vector<SharedWeight>& shared) {
  ordered list = ordered::array();
  for (const SharedWeight& w : shared)
    list.push_back(
        {{"name", w.name}, {"dtype", w.dtype}, {"shape", w.shape}, {"stages", w.stages}});
  return list;
}

ordered stage_json(const Stage& stage) {
  return {{"index", stage.index},
          {"device", stage.device},
          {"chunk", stage.chunk},
          {"file", stage.file},
          {"file_hash", stage.file_hash},
          {"backward_file", stage.backward_file},
          {"backward_file_hash", stage.backward_file_hash},
          {"nodes", stage.nodes},
          {"params", stage.params},
          {"inputs", tensors_json(stage.inputs, true)},
          {"outputs", tensors_json(stage.outputs, false)},
          {"fwd_ms", stage.fwd_ms},
          {"bwd_ms", stage.bwd_ms},
          {"send_ms", stage.send_ms},
          {"in_flight", stage.in_flight},
          {"recompute", stage.recompute},
          {"memory", memory_json(stage.memory)},
          {"arena", arena_json(stage)},
          {"backward_arena_bytes", stage.backward_arena_bytes},
          {"shared_weights", shared_json(stage.shared_weights)},
          {"shared_exchange_ms", stage.shared_exchange_ms},
          {"why", stage.why}};
}

ordered op_json(const OpRecord& op) {
  return {{"name", op.name},
          {"op_type", op.op_type},
          {"stage", op.stage},
          {"fwd_ms", op.fwd_ms},
          {"bwd_ms", op.bwd_ms},
          {"flops", op.flops},
          {"param_bytes", op.param_bytes},
          {"output_bytes", op.output_bytes}};
}

ordered prediction_json(const Prediction& prediction) {
  return {{"step_ms", prediction.step_ms},
          {"bubble_fraction", prediction.bubble_fraction},
          {"samples_per_s", prediction.samples_per_s},
          {"peak_memory_bytes", prediction.peak_memory_bytes},
          {"device_busy_ms", prediction.device_busy_ms},
          {"device_peak_bytes", prediction.device_peak_bytes},
          {"split_after", prediction.split_after},
          {"fits", prediction.fits}};
}

ordered search_json(const SplitSearch& search) {
  return {{"candidates", search.candidates},
          {"bottleneck_step_ms", search.bottleneck_step_ms},
          {"bottleneck_fits", search.bottleneck_fits},
          {"bottleneck_split_after", search.bottleneck_split_after}};
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Where a value is read from: the file for messages and the field path of the enclosing
/// object ("" at the top, "stages[2]." inside a stage).
struct Where {
  const std::string& source;
  std::string prefix;

  Where inside(std::string_view name) const {
    return name.empty() ? *this : Where{source, fmt::format("{}{}.", prefix, name)};
  }
  std::string field(std::string_view name) const { return prefix + std::string(name); }
};

[[noreturn]] void format_error(const Where& at, std::string_view name, const std::string& problem) {
  throw Error(ErrorKind::kFormat, fmt::format("field '{}' {}", at.field(name), problem))
      .in(at.source);
}

/// A short rendering of a value for messages: its JSON text, cut at 40 characters.
std::string shown(const nlohmann::json& value) {
  std::string text = value.dump();
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

/// `what` ("an integer") unless `ok`.
void expect(bool ok, const nlohmann::json& value, std::string_view name, const Where& at,
            std::string_view what) {
  if (!ok) format_error(at, name, fmt::format("is not {} (it is {})", what, shown(value)));
}

int64_t as_int64(const nlohmann::json& value, std::string_view name, const Where& at) {
  expect(value.is_number_integer(), value, name, at, "an integer");
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    format_error(at, name, fmt::format("is out of range (it is {})", shown(value)));
  }
  return value.get<int64_t>();
}

int as_int(const nlohmann::json& value, std::string_view name, const Where& at) {
  int64_t number = as_int64(value, name, at);
  if (number < std::numeric_limits<int>::min() || number > std::numeric_limits<int>::max()) {
    format_error(at, name, fmt::format("is out of range (it is {})", number));
  }
  return static_cast<int>(number);
}

double as_number(const nlohmann::json& value, std::string_view name, const Where& at) {
  expect(value.is_number(), value, name, at, "a number");
  return value.get<double>();
}

std::string as_string(const nlohmann::json& value, std::string_view name, const Where& at) {
  expect(value.is_string(), value, name, at, "a string");
  return value.get<std::string>();
}

bool as_bool(const nlohmann::json& value, std::string_view name, const Where& at) {
  expect(value.is_boolean(), value, name, at, "a boolean");
  return value.get<bool>();
}

/// The fields of one JSON object, each read with its path in errors. The object must hold
/// only `known` keys: a misspelt field would otherwise go unnoticed until it is missed.
class Fields {
 public:
  /// `value` is the field `name` of the object at `at` ("" for the top level).
  Fields(const nlohmann::json& value, const Where& at, std::string_view name,
         std::initializer_list<std::string_view> known)
      : object_(value), in_(at.inside(name)) {
    expect(value.is_object(), value, name, at, "an object");
    for (const auto& item : value.items()) {
      if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
        format_error(in_, item.key(), "is not a field of the plan format");
      }
    }
  }

  const nlohmann::json& raw(std::string_view name) const {
    auto it = object_.find(name);
    if (it == object_.end()) format_error(in_, name, "is missing");
    return *it;
  }
  bool has(std::string_view name) const { return object_.find(name) != object_.end(); }
  int64_t int64(std::string_view name) const { return as_int64(raw(name), name, in_); }
  int integer(std::string_view name) const { return as_int(raw(name), name, in_); }
  double number(std::string_view name) const { return as_number(raw(name), name, in_); }
  std::string string(std::string_view name) const { return as_string(raw(name), name, in_); }
  bool boolean(std::string_view name) const { return as_bool(raw(name), name, in_); }

  /// The array field `name`, each element read by `read(element, "name[i]", where)`.
  template <typename Read>
  auto array(std::string_view name, Read read) const {
    const nlohmann::json& list = raw(name);
    expect(list.is_array(), list, name, in_, "an array");
    std::vector<decltype(read(list, std::string(), in_))> values;
    for (size_t i = 0; i < list.size(); ++i) {
      values.push_back(read(list[i], fmt::format("{}[{}]", name, i), in_));
    }
    return values;
  }

  const Where& where() const { return in_; }

 private:
  const nlohmann::json& object_;
  Where in_;
};

MemoryBytes read_memory(const Fields& stage) {
  Fields f(
      stage.raw("memory"), stage.where(), "memory",
      {"weights", "gradients", "optimizer", "activations", "temporary", "communication", "total"});
  MemoryBytes memory{f.int64("weights"),     f.int64("gradients"), f.int64("optimizer"),
                     f.int64("activations"), f.int64("temporary"), f.int64("communication")};
  if (int64_t total = f.int64("total"); total != memory.total()) {
    format_error(f.where(), "total",
                 fmt::format("is {}, but the parts add up to {}", total, memory.total()));
  }
  return memory;
}

StageTensor read_tensor(const nlohmann::json& value, const std::string& name, const Where& at,
                        bool is_input) {
  Fields f(value, at, name,
           is_input ? std::initializer_list<std::string_view>{"name", "dtype", "shape",
                                                              "peer_stage", "bytes"}
                    : std::initializer_list<std::string_view>{
                          "name", "dtype", "shape", "peer_stages", "graph_output", "bytes"});
  StageTensor tensor;
  tensor.name = f.string("name");
  tensor.dtype = f.string("dtype");
  tensor.shape = f.array("shape", as_int64);
  if (is_input) {
    tensor.peer_stage = f.integer("peer_stage");
  } else {
    tensor.peer_stages = f.array("peer_stages", as_int);
    tensor.graph_output = f.boolean("graph_output");
  }
  tensor.bytes = f.int64("bytes");
  return tensor;
}

Stage read_stage(const nlohmann::json& value, const std::string& name, const Where& at) {
  Fields f(value, at, name,
           {"index", "device", "chunk", "file", "file_hash", "backward_file", "backward_file_hash", "nodes", "params", "inputs", "outputs",
            "fwd_ms", "bwd_ms", "send_ms", "in_flight", "recompute", "memory", "arena", "backward_arena_bytes",
            "shared_weights", "shared_exchange_ms", "why"});
  Stage stage;
  stage.index = f.integer("index");
  stage.device = f.integer("device");
  stage.chunk = f.integer("chunk");
  stage.file = f.string("file");
  stage.file_hash = f.string("file_hash");
  stage.backward_file = f.string("backward_file");
  stage.backward_file_hash = f.string("backward_file_hash");
  stage.nodes = f.array("nodes", as_string);
  stage.params = f.int64("params");
  stage.inputs = f.array("inputs", [](const auto& v, const std::string& n, const Where& w) {
    return read_tensor(v, n, w, true);
  });
  stage.outputs = f.array("outputs", [](const auto& v, const std::string& n, const Where& w) {
    return read_tensor(v, n, w, false);
  });
  stage.fwd_ms = f.number("fwd_ms");
  stage.bwd_ms = f.number("bwd_ms");
  stage.send_ms = f.number("send_ms");
  stage.in_flight = f.int64("in_flight");
  stage.recompute = f.has("recompute") && f.boolean("recompute");
  stage.memory = read_memory(f);
  {
    Fields arena(f.raw("arena"), f.where(), "arena", {"bytes", "tensors"});
    stage.arena_bytes = arena.int64("bytes");
    stage.arena = arena.array("tensors", [](const auto& v, const std::string& n, const Where& w) {
      Fields t(v, w, n, {"name", "offset", "bytes"});
      return ArenaTensor{t.string("name"), t.int64("offset"), t.int64("bytes")};
    });
  }
  stage.backward_arena_bytes = f.has("backward_arena_bytes") ? f.int64("backward_arena_bytes") : 0;
  stage.shared_weights =
      f.array("shared_weights", [](const auto& v, const std::string& n, const Where& w) {
        Fields s(v, w, n, {"name", "dtype", "shape", "stages"});
        return SharedWeight{s.string("name"), s.string("dtype"), s.array("shape", as_int64),
                            s.array("stages", as_int)};
      });
  stage.shared_exchange_ms = f.number("shared_exchange_ms");
  stage.why = f.string("why");
  return stage;
}

OpRecord read_op(const nlohmann::json& value, const std::string& name, const Where& at) {
  Fields f(
      value, at, name,
      {"name", "op_type", "stage", "fwd_ms", "bwd_ms", "flops", "param_bytes", "output_bytes"});
  return {f.string("name"),   f.string("op_type"), f.integer("stage"),     f.number("fwd_ms"),
          f.number("bwd_ms"), f.number("flops"),   f.int64("param_bytes"), f.int64("output_bytes")};
}

Prediction read_prediction(const Fields& top, std::string_view name) {
  Fields f(top.raw(name), top.where(), name,
           {"step_ms", "bubble_fraction", "samples_per_s", "peak_memory_bytes", "device_busy_ms",
            "device_peak_bytes", "split_after", "fits"});
  Prediction prediction;
  prediction.step_ms = f.number("step_ms");
  prediction.bubble_fraction = f.number("bubble_fraction");
  prediction.samples_per_s = f.number("samples_per_s");
  prediction.peak_memory_bytes = f.int64("peak_memory_bytes");
  prediction.device_busy_ms = f.array("device_busy_ms", as_number);
  prediction.device_peak_bytes = f.array("device_peak_bytes", as_int64);
  prediction.split_after = f.array("split_after", as_string);
  prediction.fits = f.boolean("fits");
  return prediction;
}

SplitSearch read_search(const Fields& top) {
  SplitSearch search;
  if (!top.has("search")) return search;
  Fields f(top.raw("search"), top.where(), "search",
           {"candidates", "bottleneck_step_ms", "bottleneck_fits", "bottleneck_split_after"});
  search.candidates = f.int64("candidates");
  search.bottleneck_step_ms = f.number("bottleneck_step_ms");
  search.bottleneck_fits = f.boolean("bottleneck_fits");
  search.bottleneck_split_after = f.array("bottleneck_split_after", as_string);
  return search;
}

// ---------------------------------------------------------------------------------------------
// Validation

/// Checks one plan, throwing `Error(kPlan)` at the first fault with the field and the numbers.
class Validator {
 public:
  Validator(const Plan& plan, const std::string& source) : plan_(plan), source_(source) {}

  void run() {
    check_header();
    check_stage_list();
    for (const Stage& stage : plan_.stages) check_stage(stage);
    for (const Stage& stage : plan_.stages) check_interfaces(stage);
    for (const Stage& stage : plan_.stages) check_shared(stage);
    check_ops();
    check_prediction(plan_.predicted, "predicted");
    check_prediction(plan_.baseline_parameters, "baseline_parameters");
    check_prediction(plan_.baseline_uniform, "baseline_uniform");
    check_search();
  }

 private:
  [[noreturn]] void fault(const std::string& field, const std::string& problem) const {
    throw Error(ErrorKind::kPlan, fmt::format("field '{}' {}", field, problem)).in(source_);
  }

  template <size_t N>
  void check_name(const std::string& field, const std::string& value,
                  const std::array<std::string_view, N>& valid) const {
    for (std::string_view name : valid) {
      if (name == value) return;
    }
    fault(field, fmt::format("is '{}'; valid: {}", value, fmt::join(valid, ", ")));
  }

  void check_hash(const std::string& field, const std::string& hash) const {
    if (hash.empty()) return;
    bool ok = hash.size() == kHashPrefix.size() + 16 && hash.starts_with(kHashPrefix) &&
              hash.find_first_not_of("0123456789abcdef", kHashPrefix.size()) == std::string::npos;
    if (!ok) fault(field, fmt::format("is '{}', not \"fnv1a64:<16 hex digits>\" or \"\"", hash));
  }

  void non_negative(const std::string& field, double value) const {
    if (std::isfinite(value) && value >= 0) return;
    fault(field, fmt::format("is {}; it must be >= 0", value));
  }

  void at_least_one(const std::string& field, int64_t value) const {
    if (value < 1) fault(field, fmt::format("is {}; it must be >= 1", value));
  }

  void check_header() const {
    check_version(plan_.format_version, source_);
    check_hash("model_hash", plan_.model_hash);
    check_name("objective", plan_.objective, kObjectives);
    check_name("schedule", plan_.schedule, kSchedules);
    check_name("precision", plan_.precision, kPrecisions);
    check_name("optimizer", plan_.optimizer, kOptimizers);
    at_least_one("devices", plan_.devices);
    at_least_one("chunks", plan_.chunks);
    at_least_one("microbatches", plan_.microbatches);
    at_least_one("microbatch_size", plan_.microbatch_size);
    if (plan_.batch != plan_.microbatches * plan_.microbatch_size) {
      fault("batch", fmt::format("is {}, but microbatches x microbatch_size is {} x {} = {}",
                                 plan_.batch, plan_.microbatches, plan_.microbatch_size,
                                 plan_.microbatches * plan_.microbatch_size));
    }
    if (plan_.chunks != 1 && plan_.schedule != "interleaved") {
      fault("chunks", fmt::format("is {}, but only the interleaved schedule has more than one "
                                  "chunk per device (schedule is '{}')",
                                  plan_.chunks, plan_.schedule));
    }
    if (plan_.schedule == "interleaved" && plan_.microbatches % plan_.devices != 0) {
      fault("microbatches", fmt::format("is {}, but the interleaved schedule needs a multiple of "
                                        "the {} devices",
                                        plan_.microbatches, plan_.devices));
    }
    if (plan_.training == (plan_.schedule == "inference")) {
      fault("training",
            fmt::format("is {}, but the schedule is '{}'", plan_.training, plan_.schedule));
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
    if (stage.device != k % plan_.devices) {
      fault(at + "device", fmt::format("is {}, but stage {} belongs on device {} (stage k on "
                                       "device k % {})",
                                       stage.device, k, k % plan_.devices, plan_.devices));
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
    non_negative(at + "send_ms", stage.send_ms);
    at_least_one(at + "in_flight", stage.in_flight);
    non_negative(at + "arena.bytes", static_cast<double>(stage.arena_bytes));
    non_negative(at + "backward_arena_bytes", static_cast<double>(stage.backward_arena_bytes));
    for (size_t t = 0; t < stage.arena.size(); ++t) {
      const ArenaTensor& a = stage.arena[t];
      if (a.offset < 0 || a.bytes < 0 || a.offset + a.bytes > stage.arena_bytes)
        fault(fmt::format("{}arena.tensors[{}]", at, t),
              fmt::format("places '{}' at [{}, {}), outside the {}-byte arena", a.name, a.offset, a.offset + a.bytes,
                          stage.arena_bytes));
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
          fault(field + ".name", fmt::format("is '{}', listed already as shared_weights[{}]",
                                             w.name, j));
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
          fault(field + ".stages",
                fmt::format("are [{}], but stage {} lists the holders of '{}' as [{}]",
                            fmt::join(w.stages, ","), holder, w.name,
                            fmt::join(other->stages, ",")));
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
    non_negative("search.bottleneck_step_ms", search.bottleneck_step_ms);
    size_t cuts = plan_.stages.size() - 1;
    if (!search.bottleneck_split_after.empty() && search.bottleneck_split_after.size() != cuts) {
      fault("search.bottleneck_split_after",
            fmt::format("has {}, but {} have {}",
                        count(search.bottleneck_split_after.size(), "entry", "entries"),
                        count(plan_.stages.size(), "stage"), count(cuts, "cut")));
    }
    for (size_t c = 0; c < search.bottleneck_split_after.size(); ++c) {
      if (!node_stage_.contains(search.bottleneck_split_after[c])) {
        fault(fmt::format("search.bottleneck_split_after[{}]", c),
              fmt::format("is '{}', a node no stage lists", search.bottleneck_split_after[c]));
      }
    }
  }

  const Plan& plan_;
  const std::string& source_;
  /// Node name -> (stage, position in its node list), filled by check_stage.
  std::unordered_map<std::string, std::pair<int, size_t>> node_stage_;
};

}  // namespace

nlohmann::ordered_json to_json(const Plan& plan) {
  ordered stages = ordered::array();
  for (const Stage& stage : plan.stages) stages.push_back(stage_json(stage));
  ordered ops = ordered::array();
  for (const OpRecord& op : plan.ops) ops.push_back(op_json(op));
  return {{"format_version", plan.format_version},
          {"generator", plan.generator},
          {"model_path", plan.model_path},
          {"model_hash", plan.model_hash},
          {"objective", plan.objective},
          {"schedule", plan.schedule},
          {"devices", plan.devices},
          {"chunks", plan.chunks},
          {"microbatches", plan.microbatches},
          {"batch", plan.batch},
          {"microbatch_size", plan.microbatch_size},
          {"training", plan.training},
          {"optimizer", plan.optimizer},
          {"training_config", training_json(plan.training_config)},
          {"precision", plan.precision},
          {"cost_model", plan.cost_model},
          {"device_spec", ordered::parse(plan.device_spec.dump())},
          {"cluster", ordered::parse(plan.cluster.dump())},
          {"predicted", prediction_json(plan.predicted)},
          {"baseline_parameters", prediction_json(plan.baseline_parameters)},
          {"baseline_uniform", prediction_json(plan.baseline_uniform)},
          {"search", search_json(plan.search)},
          {"stages", std::move(stages)},
          {"ops", std::move(ops)}};
}

Plan plan_from_json(const nlohmann::json& json, const std::string& source) {
  Where top{source, ""};
  if (!json.is_object()) {
    throw Error(ErrorKind::kFormat, fmt::format("is not a JSON object (it is {})", shown(json)))
        .in(source);
  }
  // The version first: a newer plan may differ in any other field.
  Plan plan;
  auto version = json.find("format_version");
  if (version == json.end()) format_error(top, "format_version", "is missing");
  plan.format_version = as_int(*version, "format_version", top);
  check_version(plan.format_version, source);
  Fields f(json, top, "",
           {"format_version",   "generator",       "model_path",      "model_hash",
            "objective",        "schedule",        "devices",         "chunks",
            "microbatches",     "batch",           "microbatch_size", "training",
            "optimizer",        "training_config", "precision",       "cost_model",
            "device_spec",      "cluster",         "predicted",       "baseline_parameters",
            "baseline_uniform", "search",          "stages",          "ops"});
  plan.generator = f.string("generator");
  plan.model_path = f.string("model_path");
  plan.model_hash = f.string("model_hash");
  plan.objective = f.string("objective");
  plan.schedule = f.string("schedule");
  plan.devices = f.integer("devices");
  plan.chunks = f.integer("chunks");
  plan.microbatches = f.integer("microbatches");
  plan.batch = f.int64("batch");
  plan.microbatch_size = f.int64("microbatch_size");
  plan.training = f.boolean("training");
  plan.optimizer = f.string("optimizer");
  {
    Fields t(f.raw("training_config"), f.where(), "training_config",
             {"loss", "loss_output", "labels", "lr", "weight_decay", "momentum", "beta1", "beta2", "epsilon",
              "lr_schedule", "warmup_steps", "total_steps"});
    TrainingConfig& c = plan.training_config;
    c.loss = t.string("loss");
    c.loss_output = t.string("loss_output");
    c.labels = t.string("labels");
    c.lr = t.number("lr");
    c.weight_decay = t.number("weight_decay");
    c.momentum = t.number("momentum");
    c.beta1 = t.number("beta1");
    c.beta2 = t.number("beta2");
    c.epsilon = t.number("epsilon");
    c.lr_schedule = t.string("lr_schedule");
    c.warmup_steps = t.int64("warmup_steps");
    c.total_steps = t.int64("total_steps");
  }
  plan.precision = f.string("precision");
  plan.cost_model = f.string("cost_model");
  plan.device_spec = f.raw("device_spec");
  plan.cluster = f.raw("cluster");
  plan.predicted = read_prediction(f, "predicted");
  plan.baseline_parameters = read_prediction(f, "baseline_parameters");
  plan.baseline_uniform = read_prediction(f, "baseline_uniform");
  plan.search = read_search(f);
  plan.stages = f.array("stages", read_stage);
  plan.ops = f.array("ops", read_op);
  return plan;
}

void validate_plan(const Plan& plan, const std::string& source) { Validator(plan, source).run(); }

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

Plan load_plan(const std::string& plan_dir) {
  fs::path dir(plan_dir);
  std::string path = (dir / "plan.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error(ErrorKind::kIo,
                fs::exists(dir, ec) ? "is not a plan directory" : "no such plan directory")
        .in(plan_dir);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw cannot_open(path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorKind::kIo, "read error").in(path);

  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; keep the position and the reason.
    std::string reason = e.what();
    if (auto tag = reason.find("] ");
        reason.starts_with("[json.exception") && tag != std::string::npos) {
      reason = reason.substr(tag + 2);
    }
    throw Error(ErrorKind::kFormat, "not valid JSON: " + reason).in(path);
  }
  Plan plan = plan_from_json(json, path);
  validate_plan(plan, path);

  for (const Stage& stage : plan.stages) {
    std::string file = (dir / stage.file).string();
    if (!fs::is_regular_file(file, ec)) {
      throw Error(
          ErrorKind::kIo,
          fmt::format("{} (named by plan.json's stages[{}].file)",
                      fs::exists(file, ec) ? "is not a regular file" : "is missing", stage.index))
          .in(file);
    }
    if (!stage.file_hash.empty()) {
      std::string actual = file_hash(file);
      if (actual != stage.file_hash) {
        throw Error(ErrorKind::kPlan,
                    fmt::format("hash {} does not match plan.json's {}", actual, stage.file_hash))
            .in(file);
      }
    }
    if (stage.backward_file.empty()) continue;
    std::string bwd = (dir / stage.backward_file).string();
    if (!fs::is_regular_file(bwd, ec))
      throw Error(ErrorKind::kIo, fmt::format("is missing (named by plan.json's stages[{}].backward_file)", stage.index))
          .in(bwd);
    if (file_hash(bwd) != stage.backward_file_hash)
      throw Error(ErrorKind::kPlan,
                  fmt::format("hash {} does not match plan.json's {}", file_hash(bwd), stage.backward_file_hash))
          .in(bwd);
  }
  return plan;
}

std::string file_hash(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (!file) throw cannot_open(path);
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<unsigned char> buffer(kChunk);
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a 64-bit offset basis.
  while (size_t read = std::fread(buffer.data(), 1, kChunk, file.get())) {
    for (size_t i = 0; i < read; ++i) {
      hash ^= buffer[i];
      hash *= 0x100000001b3ULL;  // FNV 64-bit prime.
    }
  }
  if (std::ferror(file.get())) {
    throw Error(ErrorKind::kIo, fmt::format("read error ({})", std::strerror(errno))).in(path);
  }
  return fmt::format("{}{:016x}", kHashPrefix, hash);
}

}  // namespace stagecraft::plan
