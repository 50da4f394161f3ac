// stagerun --profile-nodes (stagerun_profile.h).
#include "tools/stagerun_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "tools/json_formats.h"

namespace stagecraft::tools {
namespace {

// One row: an op type's nodes summed, or one node.
struct Row {
  std::string label;
  int64_t calls = 0;
  double ms = 0;
  int64_t bytes = 0;
  double flops = 0;
};

double gb_per_s(const Row& r) { return r.ms > 0 ? static_cast<double>(r.bytes) / r.ms / 1e6 : 0; }
double tflop_per_s(const Row& r) { return r.ms > 0 ? r.flops / r.ms / 1e9 : 0; }

// The share of the spec's peak the row reached: of the product peak where its FLOPs are
// counted, else of the memory bandwidth; negative without a spec.
double of_peak(const Row& r, const std::optional<ProfileSpec>& spec, const plan::Plan& plan) {
  if (!spec || r.ms <= 0) return -1;
  if (r.flops > 0) return r.flops / (r.ms * 1e-3) / spec->product_peak;
  return static_cast<double>(r.bytes) / (r.ms * 1e-3) / spec->memory_bandwidth;
}

std::vector<Row> by_op(const rt::RunReport& report) {
  std::map<std::string, Row> rows;
  for (const rt::NodeProfile& n : report.node_profile) {
    Row& r = rows[n.op_type];
    r.label = n.op_type;
    r.calls += n.calls;
    r.ms += n.ms;
    r.bytes += n.bytes;
    r.flops += n.flops;
  }
  std::vector<Row> out;
  for (auto& [op, row] : rows) out.push_back(row);
  std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return out;
}

double total_ms(const rt::RunReport& report) {
  double ms = 0;
  for (const rt::NodeProfile& n : report.node_profile) ms += n.ms;
  return ms;
}

std::string rate_cells(const Row& r, const std::optional<ProfileSpec>& spec,
                       const plan::Plan& plan) {
  const double peak = of_peak(r, spec, plan);
  return fmt::format("{:>9.1f} {:>8}  {:>6}", gb_per_s(r),
                     r.flops > 0 ? fmt::format("{:.3f}", tflop_per_s(r)) : std::string("-"),
                     peak >= 0 ? fmt::format("{:.1f}%", 100 * peak) : std::string("-"));
}

}  // namespace

std::optional<ProfileSpec> profile_spec(const plan::Plan& plan, DeviceKind backend_kind) {
  const plan::DeviceSpec& d = plan.device;
  if (d.kind != backend_kind || d.memory_bandwidth <= 0) return std::nullopt;
  // Mixed and fp16 plans run their products on the 16-bit tensor cores.
  return ProfileSpec{d.name,
                     plan.precision == Precision::kFp32 ? d.peak_flops_fp32 : d.peak_flops_fp16,
                     d.memory_bandwidth};
}

void print_node_profile(const rt::RunReport& report, const plan::Plan& plan,
                        const std::optional<ProfileSpec>& spec, std::string_view clock,
                        int64_t step, int top) {
  const double total = total_ms(report);
  fmt::print("\nper-node profile of step {} ({} nodes run, {:.3f} ms of kernels; {}; that step is "
             "left out of the step times above)\n",
             step, report.node_profile.size(), total, clock);
  if (spec)
    fmt::print("rates against {}: {:.1f} TFLOP/s for products ({}), {:.0f} GB/s of memory; "
               "%peak is of the products' peak where FLOPs are counted, else of the bandwidth\n",
               spec->name, spec->product_peak / 1e12, to_string(plan.precision),
               spec->memory_bandwidth / 1e9);
  else
    fmt::print("no %peak: the plan's device {} is not what ran, or the plan records no rates for "
               "it (plan for this machine: stagec --profile cpu, or --device-spec)\n",
               plan.device.name);
  fmt::print("  {:<27} {:>6} {:>10} {:>6} {:>9} {:>8}  {:>6}\n", "op type", "calls", "ms",
             "share", "GB/s", "TFLOP/s", "%peak");
  for (const Row& r : by_op(report))
    fmt::print("  {:<27} {:>6} {:>10.3f} {:>5.1f}% {}\n", r.label, r.calls, r.ms,
               total > 0 ? 100 * r.ms / total : 0.0, rate_cells(r, spec, plan));
  std::vector<const rt::NodeProfile*> nodes;
  for (const rt::NodeProfile& n : report.node_profile) nodes.push_back(&n);
  std::stable_sort(nodes.begin(), nodes.end(),
                   [](const rt::NodeProfile* a, const rt::NodeProfile* b) { return a->ms > b->ms; });
  const size_t shown = std::min(nodes.size(), static_cast<size_t>(std::max(0, top)));
  fmt::print("  the {} nodes taking the most time (of {}; --json lists every one):\n", shown,
             nodes.size());
  fmt::print("  {:>3} {:>5} {:<11} {:<34} {:<27} {:>5} {:>9} {:>6} {:>9} {:>8}  {:>6}\n", "dev",
             "stage", "instruction", "node", "op", "calls", "ms", "share", "GB/s", "TFLOP/s",
             "%peak");
  for (size_t k = 0; k < shown; ++k) {
    const rt::NodeProfile& n = *nodes[k];
    const Row r{n.node, n.calls, n.ms, n.bytes, n.flops};
    std::string name = n.node.size() > 34 ? n.node.substr(0, 31) + "..." : n.node;
    fmt::print("  {:>3} {:>5} {:<11} {:<34} {:<27} {:>5} {:>9.3f} {:>5.1f}% {}\n", n.device,
               n.stage, n.instruction, name, n.op_type, n.calls, n.ms,
               total > 0 ? 100 * n.ms / total : 0.0, rate_cells(r, spec, plan));
    if (!n.note.empty()) fmt::print("        {}\n", n.note);  // e.g. cuDNN's algorithm
  }
}

nlohmann::ordered_json node_profile_json(const rt::RunReport& report, const plan::Plan& plan,
                                         const std::optional<ProfileSpec>& spec,
                                         std::string_view clock, int64_t step) {
  nlohmann::ordered_json j{{"type", "node_profile"},
                           {"format_version", kRunJsonVersion},
                           {"step", step},
                           {"clock", std::string(clock)},
                           {"kernel_ms", total_ms(report)}};
  if (spec)
    j["spec"] = {{"name", spec->name},
                 {"product_peak_flops", spec->product_peak},
                 {"memory_bandwidth", spec->memory_bandwidth}};
  else
    j["spec"] = nullptr;
  auto fields = [&](nlohmann::ordered_json& o, const Row& r) {
    o["calls"] = r.calls;
    o["ms"] = r.ms;
    o["bytes"] = r.bytes;
    o["flops"] = r.flops;
    o["gb_per_s"] = gb_per_s(r);
    if (r.flops > 0) o["tflop_per_s"] = tflop_per_s(r);
    if (const double p = of_peak(r, spec, plan); p >= 0) o["of_peak"] = p;
  };
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  for (const Row& r : by_op(report)) {
    nlohmann::ordered_json o{{"op", r.label}};
    fields(o, r);
    ops.push_back(o);
  }
  j["by_op"] = ops;
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (const rt::NodeProfile& n : report.node_profile) {
    nlohmann::ordered_json o{{"device", n.device}, {"stage", n.stage},
                             {"instruction", n.instruction}, {"node", n.node},
                             {"op", n.op_type}};
    fields(o, Row{n.node, n.calls, n.ms, n.bytes, n.flops});
    if (!n.note.empty()) o["note"] = n.note;
    nodes.push_back(o);
  }
  j["nodes"] = nodes;
  return j;
}

void print_profile(const rt::RunReport& report, const rt::Pipeline& pipeline, const Args& args,
                   const rt::Backend& backend, int64_t first_step) {
  const plan::Plan& plan = pipeline.plan();
  const auto spec = profile_spec(plan, backend.kind());
  const std::string_view clock = backend.kind() == DeviceKind::kCpu
                                     ? "each node's wall time on its device's thread"
                                     : "each node's kernels between events, one node at a time";
  const int64_t step = first_step + report.profiled_step + 1;
  if (args.json)
    fmt::print("{}\n", node_profile_json(report, plan, spec, clock, step).dump());
  else if (args.trace_path != "-")  // stdout holds the trace
    print_node_profile(report, plan, spec, clock, step);
}

}  // namespace stagecraft::tools
