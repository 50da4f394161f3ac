#include "compiler/model_info.h"

#include <fmt/format.h>

#include <algorithm>

#include "cost_models/op_cost.h"

namespace stagecraft {
namespace {

std::string group_digits(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

std::string format_flops(double flops) {
  const char* units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
  int u = 0;
  while (flops >= 1000.0 && u < 5) {
    flops /= 1000.0;
    ++u;
  }
  return fmt::format("{:.3g} {}", flops, units[u]);
}

ModelInfo describe_model(const ImportedModel& model) {
  const ir::Graph& g = model.graph;
  ModelInfo info;
  info.path = g.source_path;
  info.producer = g.producer_name;
  // The file's: a model of opset 18 to 22 imports as opset 17 (the graph's), said in the text.
  info.opset = model.file_opset > 0 ? model.file_opset : g.opset;
  info.ir_version = model.file_ir_version > 0 ? model.file_ir_version : g.ir_version;
  info.read_as_opset = g.opset;
  for (ir::ValueId v : g.inputs) {
    info.inputs.push_back({g.value(v).name, std::string(dtype_name(g.value(v).dtype)), g.value(v).shape});
  }
  for (ir::ValueId v : g.outputs) {
    info.outputs.push_back({g.value(v).name, std::string(dtype_name(g.value(v).dtype)), g.value(v).shape});
  }
  info.bound_dims = model.bound_dims;
  info.nodes_in_file = model.nodes_in_file;
  info.folded = model.folded;
  info.attention_not_fused = model.attention_not_fused;
  for (const auto& node : g.nodes()) {
    if (node.dead) continue;
    ++info.nodes;
    ++info.op_counts[node.op_type];
    info.forward_flops += cost::forward_work(g, node).flops;
  }
  // BatchNormalization's running mean and variance are weights of the file but not trained.
  std::vector<bool> running_stat(g.num_values(), false);
  for (const auto& node : g.nodes()) {
    if (node.dead || node.op_type != "BatchNormalization") continue;
    for (std::size_t i = 3; i < node.inputs.size() && i < 5; ++i) {
      if (node.inputs[i] != ir::kNoId) running_stat[node.inputs[i]] = true;
    }
  }
  for (std::size_t id = 0; id < g.num_values(); ++id) {
    const ir::Value& v = g.value(static_cast<ir::ValueId>(id));
    if (!v.is_initializer()) continue;
    if (v.is_weight && !running_stat[id]) {
      info.parameters += v.numel();
      info.parameter_bytes += v.bytes();
    } else {
      info.constants += v.numel();
      info.constant_bytes += v.bytes();
    }
    if (v.initializer->is_external()) info.external_bytes += v.initializer->size();
  }
  return info;
}

std::string render_text(const ModelInfo& info) {
  std::string out;
  auto line = [&](std::string_view label, const std::string& text) {
    out += fmt::format("{:<12}{}\n", label, text);
  };
  line("model", fmt::format("{} (opset {}{}, ir {}, producer {})", info.path, info.opset,
                            info.read_as_opset != info.opset
                                ? fmt::format(", read as {}", info.read_as_opset)
                                : std::string(),
                            info.ir_version, info.producer.empty() ? "unknown" : info.producer));
  if (info.bound_dims.empty()) {
    line("bound dims", "none (every input dim is fixed in the model)");
  } else {
    std::string dims;
    for (const auto& b : info.bound_dims) {
      dims += fmt::format("{}{}={} ({} dim {}, {})", dims.empty() ? "" : "; ",
                          b.name.empty() ? "<unnamed>" : b.name, b.value, b.input, b.index, b.flag);
    }
    line("bound dims", dims);
  }
  for (std::size_t i = 0; i < info.inputs.size(); ++i) {
    const auto& t = info.inputs[i];
    line(i == 0 ? "inputs" : "", fmt::format("{} {}{}", t.name, t.dtype, ir::shape_string(t.shape)));
  }
  for (std::size_t i = 0; i < info.outputs.size(); ++i) {
    const auto& t = info.outputs[i];
    line(i == 0 ? "outputs" : "", fmt::format("{} {}{}", t.name, t.dtype, ir::shape_string(t.shape)));
  }
  std::string folded;
  for (const auto& [pass, count] : info.folded) folded += fmt::format("{}{} {}", folded.empty() ? "" : ", ", pass, count);
  line("nodes", fmt::format("{} after import ({} in the file{}{})", info.nodes, info.nodes_in_file,
                            folded.empty() ? "" : "; ", folded));
  std::vector<std::pair<std::string, int64_t>> ops(info.op_counts.begin(), info.op_counts.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string op_line;
  for (const auto& [op, count] : ops) op_line += fmt::format("{}{} {}", op_line.empty() ? "" : ", ", op, count);
  line("ops", op_line);
  // How many attention blocks became one fused node, and why the others did not.
  const auto fused = info.folded.find("fuse-attention");
  const int64_t fused_count = fused == info.folded.end() ? 0 : fused->second;
  if (fused_count > 0 || !info.attention_not_fused.empty())
    line("attention", fmt::format("{} block{} fused{}", fused_count, fused_count == 1 ? "" : "s",
                                  info.attention_not_fused.empty()
                                      ? ""
                                      : fmt::format(", {} not", info.attention_not_fused.size())));
  for (const std::string& why : info.attention_not_fused) line("", "not fused: " + why);
  // How many GELUs became one fused node; the other form's, in a graph holding both, stay.
  const auto count = [&](const char* key) {
    const auto it = info.folded.find(key);
    return it == info.folded.end() ? int64_t{0} : it->second;
  };
  if (const int64_t gelu = count("fuse-gelu"); gelu > 0)
    line("gelu", fmt::format("{} fused{}", gelu,
                             count("fuse-gelu: not fused (other form)") > 0
                                 ? fmt::format(", {} of the other form not",
                                               count("fuse-gelu: not fused (other form)"))
                                 : ""));
  line("parameters", fmt::format("{} ({}){}", group_digits(info.parameters), format_bytes(info.parameter_bytes),
                                 info.external_bytes > 0
                                     ? fmt::format(", {} in external data", format_bytes(info.external_bytes))
                                     : ""));
  line("constants", fmt::format("{} elements ({})", group_digits(info.constants), format_bytes(info.constant_bytes)));
  line("forward", fmt::format("{} per batch at the bound shapes", format_flops(info.forward_flops)));
  return out;
}

nlohmann::ordered_json to_json(const ModelInfo& info) {
  using json = nlohmann::ordered_json;
  auto tensors = [](const std::vector<ModelInfo::Tensor>& ts) {
    json a = json::array();
    for (const auto& t : ts) a.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
    return a;
  };
  json bound = json::array();
  for (const auto& b : info.bound_dims) {
    bound.push_back({{"input", b.input}, {"index", b.index}, {"name", b.name}, {"value", b.value}, {"flag", b.flag}});
  }
  return {
      {"model", info.path},
      {"producer", info.producer},
      {"opset", info.opset},
      {"ir_version", info.ir_version},
      {"inputs", tensors(info.inputs)},
      {"outputs", tensors(info.outputs)},
      {"bound_dims", bound},
      {"nodes_in_file", info.nodes_in_file},
      {"nodes", info.nodes},
      {"folded", info.folded},
      {"attention_not_fused", info.attention_not_fused},
      {"op_counts", info.op_counts},
      {"parameters", info.parameters},
      {"parameter_bytes", info.parameter_bytes},
      {"constants", info.constants},
      {"constant_bytes", info.constant_bytes},
      {"external_bytes", info.external_bytes},
      {"forward_flops", info.forward_flops},
  };
}

bool in_module(std::string_view node_name, std::string_view module) {
  if (module.empty() || node_name.size() <= module.size() + 1 || node_name.front() != '/')
    return false;
  // Scopes joined by '/' in the name, by '.' in the module path (a ModuleList index keeps its
  // own '.': layers.2).
  for (std::size_t i = 0; i < module.size(); ++i) {
    const char c = node_name[i + 1];
    if (!(c == module[i] || (c == '/' && module[i] == '.'))) return false;
  }
  const char next = node_name[module.size() + 1];
  return next == '/' || next == '.';
}

std::string module_of(std::string_view node_name, int depth) {
  if (node_name.empty() || node_name.front() != '/') return "";
  const std::size_t last = node_name.rfind('/');
  std::string module;
  std::size_t start = 1;
  for (int level = 0; level < depth && start < last; ++level) {
    const std::size_t end = node_name.find('/', start);
    if (!module.empty()) module += '.';
    module += node_name.substr(start, end - start);
    start = end + 1;
  }
  return module;
}

}  // namespace stagecraft
