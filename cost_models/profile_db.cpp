#include "cost_models/profile_db.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/format/error.h"
#include "runtime/format/instruction_costs.h"
#include "runtime/format/json_reader.h"

namespace stagecraft::cost {
namespace {

constexpr const char* kFormatName = "stagecraft-profile";
/// Integer constant inputs up to this many elements enter a signature's hash.
constexpr int64_t kSmallConstantElements = 64;

struct Fnv1a {
  uint64_t h = 14695981039346656037ull;
  void add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  }
  void add(std::string_view s) {
    add(s.data(), s.size());
    add("\0", 1);
  }
};

bool is_integer(DType d) {
  switch (d) {
    case DType::kInt8: case DType::kInt16: case DType::kInt32: case DType::kInt64:
    case DType::kUInt8: case DType::kUInt16: case DType::kUInt32: case DType::kUInt64: case DType::kBool:
      return true;
    default:
      return false;
  }
}

std::string tensor_type(const ir::Value& v) {
  return fmt::format("{}{}", dtype_name(v.dtype), v.shape_known ? ir::shape_string(v.shape) : std::string("[?]"));
}

/// The oldest file version `load` still reads (forward entries only).
constexpr int kOldestVersion = 1;

/// A backward entry's key: one of 'a', 'w', '-' per input, at least one 'a' or 'w'.
bool valid_kinds(const std::string& kinds) {
  return kinds.find_first_not_of("aw-") == std::string::npos && kinds.find_first_of("aw") != std::string::npos;
}

/// One part (B or W) of a backward entry: `<part>_ms` and `<part>_runs`, both or neither.
void read_part(const JsonObject& object, const std::string& part, double& ms, int64_t& runs) {
  const std::string ms_field = part + "_ms", runs_field = part + "_runs";
  const bool has_ms = object.has(ms_field), has_runs = object.has(runs_field);
  if (has_ms != has_runs) {
    object.fail(has_ms ? ms_field : runs_field,
                fmt::format("is given without '{}'", has_ms ? runs_field : ms_field));
  }
  if (!has_ms) return;
  ms = object.positive_number(ms_field);
  runs = object.positive_int64(runs_field);
}

BackwardEntry read_backward(const JsonValue& value) {
  JsonObject f = value.object({"input_ms", "input_runs", "weight_ms", "weight_runs"});
  BackwardEntry b;
  read_part(f, "input", b.input_ms, b.input_runs);
  read_part(f, "weight", b.weight_ms, b.weight_runs);
  return b;
}

/// One entry of the database; `has_backward` from version 2 on.
ProfileEntry read_entry(const JsonValue& value, bool has_backward) {
  JsonObject f = has_backward ? value.object({"op", "fwd_ms", "runs", "backward"})
                              : value.object({"op", "fwd_ms", "runs"});
  ProfileEntry e;
  e.op = f.nonempty_string("op");
  e.fwd_ms = f.positive_number("fwd_ms");
  e.runs = f.positive_int64("runs");
  if (auto backward = f.find("backward")) {
    for (const auto& [kinds, part] : backward->object().entries()) {
      if (!valid_kinds(kinds)) {
        backward->fail(
            fmt::format("has the key \"{}\": input kinds are one of a, w, - per input, "
                        "at least one a or w",
                        kinds));
      }
      e.backward[kinds] = read_backward(part);
    }
  }
  return e;
}

nlohmann::ordered_json backward_json(const BackwardEntry& b) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (b.input_runs > 0) {
    j["input_ms"] = b.input_ms;
    j["input_runs"] = b.input_runs;
  }
  if (b.weight_runs > 0) {
    j["weight_ms"] = b.weight_ms;
    j["weight_runs"] = b.weight_runs;
  }
  return j;
}

/// Kind name -> milliseconds (>= 0), each key a schedule instruction kind.
std::map<std::string, double> read_instruction_ms(const JsonValue& value) {
  std::map<std::string, double> out;
  for (const auto& [kind, ms] : value.object().entries()) {
    try {
      schedule::parse_op(kind);
    } catch (const Error&) {
      value.fail(fmt::format("has the key \"{}\", not an instruction kind (FWD, BWD, BWD_INPUT, "
                             "BWD_WEIGHT, SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD, ALLREDUCE, "
                             "ALLREDUCE_SHARED, OPT_STEP)",
                             kind));
    }
    const double v = ms.number();
    if (!(v >= 0) || !std::isfinite(v)) ms.fail(fmt::format("is {}; it must be >= 0", v));
    out[kind] = v;
  }
  return out;
}

InstructionTerms read_calibration(const JsonValue& value) {
  JsonObject f =
      value.object({"trace", "measured_step_ms", "steps", "instruction_ms", "stage_factors",
                    "device_start_ms", "op_factors", "step_overhead_ms"});
  InstructionTerms t;
  t.source = "calibration";
  t.trace = f.string("trace");
  t.measured_step_ms = f.number("measured_step_ms");
  t.steps = f.int32("steps");
  if (f.has("step_overhead_ms")) {  // absent in calibrations kept before it: none
    t.step_overhead_ms = f.number("step_overhead_ms");
    if (!(t.step_overhead_ms >= 0) || !std::isfinite(t.step_overhead_ms))
      f.fail("step_overhead_ms", fmt::format("is {}; it must be >= 0", t.step_overhead_ms));
  }
  t.instruction_ms = read_instruction_ms(f.at("instruction_ms"));
  if (auto starts = f.find("device_start_ms")) {
    t.device_start_ms = starts->numbers();
    for (double ms : t.device_start_ms)
      if (!(ms >= 0) || !std::isfinite(ms)) starts->fail(fmt::format("has {}; each must be >= 0", ms));
  }
  t.stage_factors = f.array("stage_factors", [](const JsonValue& stage) {
    std::map<std::string, double> factors = read_instruction_ms(stage);
    for (const auto& [kind, factor] : factors)
      if (!(factor > 0)) stage.fail(fmt::format("has factor {} for {}; it must be > 0", factor, kind));
    return factors;
  });
  if (auto ops = f.find("op_factors")) t.op_factors = plan::read_op_factors(*ops);
  return t;
}

nlohmann::ordered_json calibration_json(const InstructionTerms& t) {
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const auto& factors : t.stage_factors) stages.push_back(factors);
  nlohmann::ordered_json out{{"trace", t.trace},
                             {"measured_step_ms", t.measured_step_ms},
                             {"steps", t.steps},
                             {"instruction_ms", t.instruction_ms},
                             {"stage_factors", std::move(stages)},
                             {"device_start_ms", t.device_start_ms},
                             {"step_overhead_ms", t.step_overhead_ms}};
  if (!t.op_factors.empty()) out["op_factors"] = plan::op_factors_json(t.op_factors);
  return out;
}

}  // namespace

ProfileDb::ProfileDb(std::string backend, int threads) : backend_(std::move(backend)), threads_(threads) {}

ProfileDb ProfileDb::load(const std::string& path) {
  nlohmann::json j = read_json_file(path);
  JsonObject top = JsonValue(j, path).object({"format", "version", "backend", "threads", "kernels",
                                              "entries", "instruction_ms", "calibration"});
  std::string format = top.nonempty_string("format");
  if (format != kFormatName) {
    top.fail("format", fmt::format("is \"{}\", not \"{}\": not a stagecraft profile database",
                                   format, kFormatName));
  }
  const nlohmann::json& version = top.at("version").raw();
  if (!version.is_number_integer() || version.get<int64_t>() < kOldestVersion ||
      version.get<int64_t>() > kVersion) {
    top.fail("version", fmt::format("is {}; this stagec reads versions {} to {} (delete the file "
                                    "to profile again)",
                                    version.dump(), kOldestVersion, kVersion));
  }
  const bool has_backward = version.get<int64_t>() >= 2;
  std::string backend = top.nonempty_string("backend");
  int64_t threads = top.positive_int64("threads");
  if (threads > 1 << 16) {
    top.fail("threads", fmt::format("is {}, more than any machine has", threads));
  }
  ProfileDb db(backend, static_cast<int>(threads));
  if (top.find("kernels")) db.kernels_ = top.string("kernels");  // absent in older files: ""
  for (const auto& [key, value] : top.at("entries").object().entries()) {
    db.entries_[key] = read_entry(value, has_backward);
  }
  if (auto ms = top.find("instruction_ms")) db.instruction_ms_ = read_instruction_ms(*ms);
  if (auto calibration = top.find("calibration"))
    for (const auto& [key, value] : calibration->object().entries())
      db.calibrations_[key] = read_calibration(value);
  return db;
}

ProfileDb ProfileDb::open(const std::string& path, const std::string& backend, int threads) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return ProfileDb(backend, threads);
  ProfileDb db = load(path);
  if (db.backend() != backend) {
    throw Error(ErrorKind::kUsage, fmt::format("field 'backend' is \"{}\": the database was measured on another "
                                               "backend than {} (give another --profile-db)",
                                               db.backend(), backend))
        .in(path);
  }
  if (db.threads() != threads) {
    throw Error(ErrorKind::kUsage,
                fmt::format("field 'threads' is {}: the database was measured with {} thread{}, not the {} asked for "
                            "(give --profile-threads {} or another --profile-db)",
                            db.threads(), db.threads(), db.threads() == 1 ? "" : "s", threads, db.threads()))
        .in(path);
  }
  return db;
}

void ProfileDb::save(const std::string& path) const {
  namespace fs = std::filesystem;
  nlohmann::ordered_json j;
  j["format"] = kFormatName;
  j["version"] = kVersion;
  j["backend"] = backend_;
  j["threads"] = threads_;
  if (!kernels_.empty()) j["kernels"] = kernels_;
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  for (const auto& [key, e] : entries_) {
    nlohmann::ordered_json entry = {{"op", e.op}, {"fwd_ms", e.fwd_ms}, {"runs", e.runs}};
    if (!e.backward.empty()) {
      nlohmann::ordered_json backward = nlohmann::ordered_json::object();
      for (const auto& [kinds, b] : e.backward) backward[kinds] = backward_json(b);
      entry["backward"] = std::move(backward);
    }
    entries[key] = std::move(entry);
  }
  j["entries"] = std::move(entries);
  if (!instruction_ms_.empty()) j["instruction_ms"] = instruction_ms_;
  if (!calibrations_.empty()) {
    nlohmann::ordered_json calibration = nlohmann::ordered_json::object();
    for (const auto& [key, t] : calibrations_) calibration[key] = calibration_json(t);
    j["calibration"] = std::move(calibration);
  }
  std::string text = j.dump(1) + "\n";

  fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    if (ec) throw Error(ErrorKind::kIo, fmt::format("cannot create its folder: {}", ec.message())).in(path);
  }
  // The temporary file sits beside the target so the rename never crosses file systems.
  std::string temp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      fs::remove(temp, ec);
      throw Error(ErrorKind::kIo, "cannot be written").in(temp);
    }
  }
  fs::rename(temp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw Error(ErrorKind::kIo, fmt::format("cannot be replaced: {}", ec.message())).in(path);
  }
}

const ProfileEntry* ProfileDb::find(const std::string& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

void ProfileDb::put(const std::string& key, ProfileEntry entry) { entries_[key] = std::move(entry); }

const BackwardEntry* ProfileDb::find_backward(const std::string& key, const std::string& kinds) const {
  const ProfileEntry* e = find(key);
  if (e == nullptr) return nullptr;
  auto it = e->backward.find(kinds);
  return it == e->backward.end() ? nullptr : &it->second;
}

void ProfileDb::put_backward(const std::string& key, const std::string& kinds, BackwardEntry entry) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    fail(ErrorKind::kInternal, "profile database: backward of {} (inputs {}) recorded before its forward", key, kinds);
  }
  it->second.backward[kinds] = entry;
}

void ProfileDb::clear_measurements() {
  entries_.clear();
  instruction_ms_.clear();
  calibrations_.clear();
}

const InstructionTerms* ProfileDb::find_calibration(const std::string& key) const {
  auto it = calibrations_.find(key);
  return it == calibrations_.end() ? nullptr : &it->second;
}

void ProfileDb::put_calibration(const std::string& key, InstructionTerms terms) {
  calibrations_[key] = std::move(terms);
}

std::string signature_key(const ir::Graph& graph, const ir::Node& node) {
  std::string key = node.domain.empty() || node.domain == "ai.onnx" ? node.op_type : node.domain + "." + node.op_type;
  std::vector<std::string> ins, outs;
  Fnv1a hash;
  for (ir::ValueId v : node.inputs) {
    if (v == ir::kNoId) {
      ins.emplace_back("-");
      hash.add("-");
      continue;
    }
    const ir::Value& value = graph.value(v);
    ins.push_back(tensor_type(value));
    // Small integer constants (axes, pads, Slice bounds, Reshape targets) steer the kernel.
    bool steering = value.is_initializer() && !value.is_weight && is_integer(value.dtype) && value.shape_known &&
                    value.numel() <= kSmallConstantElements;
    if (steering) {
      auto bytes = value.initializer->bytes();
      hash.add("c");
      hash.add(bytes.data(), bytes.size());
    } else {
      hash.add("t");
    }
  }
  for (ir::ValueId v : node.outputs) outs.push_back(v == ir::kNoId ? std::string("-") : tensor_type(graph.value(v)));
  std::vector<const onnx::AttributeProto*> attrs;
  for (const auto& a : node.attributes) attrs.push_back(&a);
  std::sort(attrs.begin(), attrs.end(), [](const auto* a, const auto* b) { return a->name() < b->name(); });
  for (const auto* a : attrs) {
    onnx::AttributeProto copy = *a;
    copy.clear_doc_string();
    hash.add(copy.name());
    hash.add(copy.SerializeAsString());
  }
  return fmt::format("{}({})->({})#{:016x}", key, fmt::join(ins, ","), fmt::join(outs, ","), hash.h);
}

std::string input_kinds(const ir::Graph& graph, const ir::Node& node) {
  std::string kinds;
  for (ir::ValueId v : node.inputs) {
    if (v == ir::kNoId) {
      kinds += '-';
      continue;
    }
    const ir::Value& value = graph.value(v);
    if (!value.is_initializer() && is_floating(value.dtype)) {
      kinds += 'a';
    } else if (value.is_initializer() && value.is_weight && value.dtype == DType::kFloat32) {
      kinds += 'w';
    } else {
      kinds += '-';
    }
  }
  return kinds;
}

bool reads_only_graph_inputs(const ir::Graph& graph, const ir::Node& node,
                             const std::string& kinds) {
  bool any = false;
  for (size_t k = 0; k < node.inputs.size() && k < kinds.size(); ++k) {
    if (kinds[k] != 'a') continue;
    if (!graph.value(node.inputs[k]).is_graph_input) return false;
    any = true;
  }
  return any;
}

bool may_have_backward(const ir::Graph& graph, const ir::Node& node) {
  bool float_output = false;
  for (ir::ValueId out : node.outputs) {
    float_output = float_output || (out != ir::kNoId && is_floating(graph.value(out).dtype));
  }
  return float_output && input_kinds(graph, node).find_first_of("aw") != std::string::npos;
}

MeasuredCostModel::MeasuredCostModel(const ProfileDb& db, const RooflineCostModel& roofline, BackwardTimes backward)
    : entries_(db.entries()),
      backend_(db.backend()),
      threads_(db.threads()),
      backward_(backward),
      roofline_(roofline) {}

OpTime MeasuredCostModel::op_time(const ir::Graph& graph, const ir::Node& node) const {
  std::string key = signature_key(graph, node);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    fail(ErrorKind::kPlan, "{} has no measurement in the profile database (signature {}); profile the graph first",
         node.describe(graph), key);
  }
  OpTime t;
  t.forward_s = it->second.fwd_ms * 1e-3;
  if (backward_ == BackwardTimes::kNone) return t;
  if (backward_ == BackwardTimes::kMeasured) {
    if (!may_have_backward(graph, node)) return t;
    const std::string kinds = input_kinds(graph, node);
    auto b = it->second.backward.find(kinds);
    if (b != it->second.backward.end()) {
      // The entry's input part is measured wherever the signature stands; a node whose
      // activations are all graph inputs (the first layer) has none in a run.
      t.backward_input_s =
          reads_only_graph_inputs(graph, node, kinds) ? 0 : b->second.input_ms * 1e-3;
      t.backward_weight_s = b->second.weight_ms * 1e-3;
      t.backward_s = t.backward_input_s + t.backward_weight_s;
      return t;
    }
  }
  OpTime r = roofline_.op_time(graph, node);
  if (r.forward_s > 0 && r.backward_s > 0) {
    double scale = t.forward_s / r.forward_s;
    t.backward_input_s = r.backward_input_s * scale;
    t.backward_weight_s = r.backward_weight_s * scale;
    t.backward_s = t.backward_input_s + t.backward_weight_s;
  }
  return t;
}

std::string MeasuredCostModel::name() const {
  const char* backward = backward_ == BackwardTimes::kMeasured ? ", forward and backward"
                         : backward_ == BackwardTimes::kNone  ? ", forward"
                                                              : " + roofline ratios for backward";
  return fmt::format("measured({}, {} thread{}){}", backend_, threads_, threads_ == 1 ? "" : "s", backward);
}

}  // namespace stagecraft::cost
