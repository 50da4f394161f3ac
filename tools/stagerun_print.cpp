// stagerun's report: the figures as text or JSON Lines, --outputs and --trace (stagerun_print.h).
#include "tools/stagerun_print.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"
#include "tools/dump/measured.h"
#include "tools/dump/render.h"
#include "tools/dump/view.h"
#include "tools/json_formats.h"
#include "tools/stagerun_inputs.h"
#include "tools/stagerun_stop.h"

namespace stagecraft::tools {

namespace fs = std::filesystem;

namespace {

/// The process's peak resident set (getrusage), in bytes.
int64_t peak_rss_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

// --outputs: the last step's graph outputs as DIR/NAME.npy; the files written, for the report.
nlohmann::ordered_json write_outputs(const rt::RunReport& report, const std::string& outputs_dir) {
  nlohmann::ordered_json outputs = nlohmann::ordered_json::array();
  if (outputs_dir.empty()) return outputs;
  for (const auto& [name, tensor] : report.outputs) {
    std::string file = (fs::path(outputs_dir) / (file_stem(name) + ".npy")).string();
    rt::write_npy(file, tensor);
    outputs.push_back({{"name", name},
                       {"dtype", dtype_name(tensor.dtype)},
                       {"shape", tensor.shape},
                       {"file", file}});
  }
  return outputs;
}

// --trace: the measured run as a Chrome trace ('-': stdout): every step, split by the schedule
// (tools/dump/measured.h), and every device's memory track, in the form of stagedump --trace.
void write_trace(const rt::RunReport& report, const Args& args, const rt::Pipeline& pipeline) {
  if (args.trace_path.empty()) return;
  std::vector<dump::MeasuredStep> steps = dump::split_steps(
      report.events, pipeline.plan(), pipeline.schedule(), args.trace_path,
      [](size_t i) { return fmt::format("event {}", i); });
  // The traced steps are the run's first ones (--trace-steps): each one's length as the run
  // measured it, barriers included.
  for (size_t k = 0; k < steps.size() && k < report.step_s.size(); ++k)
    steps[k].runtime_ms = report.step_s[k] * 1e3;
  std::vector<dump::MeasuredMemory> memory;
  for (const rt::MemorySample& m : report.memory) memory.push_back({m.device, m.time_s, m.bytes});
  std::string text = dump::measured_trace(pipeline.plan(), steps, memory).dump(1) + "\n";
  if (args.trace_path == "-") {
    fmt::print("{}", text);
    return;
  }
  std::ofstream out(args.trace_path, std::ios::binary);
  if (out) out << text;
  if (!out) fail(ErrorKind::kIo, "--trace {}: cannot write", args.trace_path);
}

namespace {

// The steps the reported median is over: every step after the first (the warm-up), or the one
// step there is.
std::vector<double> steady_steps(const rt::RunReport& report) {
  if (report.step_s.size() < 2) return report.step_s;
  // Without the warm-up, and without a step --profile-nodes timed node by node while another
  // remains (rt::median_step's rule).
  std::vector<double> out;
  for (size_t k = 1; k < report.step_s.size(); ++k)
    if (static_cast<int>(k) != report.profiled_step) out.push_back(report.step_s[k]);
  return out.empty() ? std::vector<double>{report.step_s[1]} : out;
}

// The inputs as the report names them.
std::string inputs_label(const Args& args, bool json) {
  if (!args.data_dir.empty())
    return json ? args.data_dir : "--data " + args.data_dir + " (step s: batch s mod K)";
  if (!args.tokens_path.empty())
    return json ? args.tokens_path
                : fmt::format("--tokens {} (windows of T+1 tokens, {})", args.tokens_path,
                              args.shuffle ? fmt::format("shuffled each epoch, seed {}", args.seed)
                                           : std::string("in file order"));
  if (args.inputs_path.empty()) return json ? "synthetic" : "synthetic (deterministic)";
  return args.inputs_path;
}

}  // namespace

// --json: JSON Lines, one record per step, then the summary (schema: file comment and
// docs/schemas/stagerun.schema.json).
void print_json(const rt::RunReport& report, const rt::Pipeline& pipeline, const Args& args,
                std::string_view backend, const std::string& auto_reason, int64_t first_step,
                const nlohmann::ordered_json& outputs, const std::vector<std::string>& warnings,
                const std::string& gap, const std::vector<int64_t>& epochs) {
  const plan::Plan& plan = pipeline.plan();
  double step_s = report.step_s[report.reported_step];
  for (size_t k = 0; k < report.step_s.size(); ++k) {
    nlohmann::ordered_json record{{"type", "step"},
                                  {"format_version", tools::kRunJsonVersion},
                                  {"step", first_step + static_cast<int64_t>(k) + 1},
                                  {"step_ms", report.step_s[k] * 1e3}};
    if (k < report.losses.size()) record["loss"] = report.losses[k];
    if (k < epochs.size()) record["epoch"] = epochs[k];
    if (k < report.loss_scale.size()) {
      record["loss_scale"] = report.loss_scale[k];
      record["skipped"] = static_cast<bool>(report.skipped[k]);
    }
    if (k < report.grad_norm.size() && std::isfinite(report.grad_norm[k]))
      record["grad_norm"] = report.grad_norm[k];  // none on a step skipped for an inf or NaN
    fmt::print("{}\n", record.dump());
  }
  if (report.stop_signal != 0) {
    nlohmann::ordered_json stopped{{"type", "stopped"},
                                   {"format_version", tools::kRunJsonVersion},
                                   {"signal", tools::signal_name(report.stop_signal)},
                                   {"after_step", first_step + std::ssize(report.step_s)},
                                   {"checkpoint", nullptr}};
    if (!args.checkpoint_dir.empty() && pipeline.plan().training)
      stopped["checkpoint"] = args.checkpoint_dir;
    fmt::print("{}\n", stopped.dump());
  }
  nlohmann::ordered_json j;
  j["type"] = "summary";
  j["format_version"] = tools::kRunJsonVersion;
  j["plan"] = args.plan_dir;
  j["backend"] = std::string(backend);
  if (!auto_reason.empty()) j["backend_auto"] = auto_reason;  // why --backend auto chose it
  j["threads_per_device"] = args.threads;
  if (args.deterministic) j["deterministic"] = true;
  j["spin_us"] = report.spin_us;
  j["devices"] = plan.devices * plan.data_parallel;
  j["data_parallel"] = plan.data_parallel;
  j["microbatches"] = plan.microbatches;
  j["schedule"] = std::string(to_string(plan.schedule));
  j["batch"] = plan.batch;
  j["steps"] = args.steps;
  j["inputs"] = inputs_label(args, true);
  nlohmann::ordered_json ms = nlohmann::ordered_json::array();
  for (double s : report.step_s) ms.push_back(s * 1e3);
  j["step_ms"] = ms;
  j["median_step_ms"] = step_s * 1e3;
  // The median leaves the first step (the warm-up) out when there are others.
  j["median_of_steps"] = steady_steps(report).size();
  j["warmup_step_ms"] = report.step_s.front() * 1e3;
  j["median_excludes_warmup"] = report.step_s.size() > 1;
  j["samples_per_s"] = step_s > 0 ? static_cast<double>(plan.batch) / step_s : 0;
  j["bubble"] = {{"measured", report.bubble_fraction},
                 {"predicted", plan.predicted.bubble_fraction}};
  j["predicted_step_ms"] = plan.predicted.step_ms;
  j["cost_model"] = plan.cost_model;
  j["plan_device"] = {{"name", plan.device.name}, {"kind", to_string(plan.device.kind)}};
  j["warnings"] = warnings;
  if (!gap.empty()) j["prediction_gap"] = gap;
  if (!report.losses.empty()) j["final_loss"] = report.losses.back();
  if (!report.loss_scale.empty())
    j["loss_scale"] = {
        {"scale", pipeline.loss_scale().scale},
        {"skipped_steps", std::count(report.skipped.begin(), report.skipped.end(), true)}};
  nlohmann::ordered_json devs = nlohmann::ordered_json::array();
  for (size_t d = 0; d < report.devices.size(); ++d) {
    const rt::DeviceReport& r = report.devices[d];
    devs.push_back({{"device", d},
                    {"busy_fraction", step_s > 0 ? r.busy_s / step_s : 0.0},
                    {"send_ms", r.send_s * 1e3},
                    {"peak_bytes", r.peak_bytes},
                    {"predicted_peak_bytes", r.predicted_peak_bytes},
                    {"arena_bytes", r.arena_bytes},
                    {"weight_bytes", r.weight_bytes}});
    if (r.device_peak_bytes >= 0) devs.back()["device_peak_bytes"] = r.device_peak_bytes;
    if (r.device_used_bytes >= 0) devs.back()["device_used_bytes"] = r.device_used_bytes;
    if (r.host_waits >= 0) {
      devs.back()["host_waits"] = r.host_waits;
      devs.back()["host_wait_ms"] = r.host_wait_s * 1e3;
    }
    if (plan.data_parallel > 1 && d < report.allreduce_s.size())
      devs.back()["allreduce_ms"] = report.allreduce_s[d] * 1e3;
  }
  j["device"] = devs;
  j["process_peak_rss_bytes"] = peak_rss_bytes();
  j["outputs"] = outputs;
  fmt::print("{}\n", j.dump());
}

// The figures as text.
void print_text(const rt::RunReport& report, const rt::Pipeline& pipeline, const Args& args,
                std::string_view backend, int64_t first_step,
                const nlohmann::ordered_json& outputs, const std::string& gap,
                const std::vector<int64_t>& epochs) {
  const plan::Plan& plan = pipeline.plan();
  const int threads = args.threads;
  double step_s = report.step_s[report.reported_step];
  double samples_per_s = step_s > 0 ? static_cast<double>(plan.batch) / step_s : 0;
  std::vector<double> sorted = steady_steps(report);
  std::sort(sorted.begin(), sorted.end());
  const int devices = plan.devices * plan.data_parallel;
  fmt::print(
      "plan {}: {} on {} device{}{}, {} microbatches of {}{} (batch {}); backend {}, {} thread{} "
      "per device\n",
      args.plan_dir, to_string(plan.schedule), devices, devices == 1 ? "" : "s",
      plan.data_parallel > 1 ? fmt::format(" ({} replicas x {})", plan.data_parallel, plan.devices)
                             : "",
      plan.microbatches, plan.microbatch_size, plan.data_parallel > 1 ? " per replica" : "",
      plan.batch, backend, threads, threads == 1 ? "" : "s");
  fmt::print("inputs: {}\n", inputs_label(args, false));
  for (size_t k = 0; k < report.losses.size(); ++k)
    fmt::print("step {:>4}  loss {:.6g}  {:.3f} ms{}{}\n", first_step + static_cast<int64_t>(k) + 1,
               report.losses[k], report.step_s[k] * 1e3,
               k < epochs.size() ? fmt::format("  epoch {}", epochs[k]) : "",
               k < report.loss_scale.size()
                   ? fmt::format("  loss scale {:g}{}", report.loss_scale[k],
                                 report.skipped[k] ? "  skipped (inf/NaN gradient)" : "")
                   : "");
  if (!report.loss_scale.empty())
    fmt::print("dynamic loss scaling: {} of {} steps skipped, scale now {:g}\n",
               std::count(report.skipped.begin(), report.skipped.end(), true),
               report.skipped.size(), pipeline.loss_scale().scale);
  if (report.step_s.size() > 1)
    fmt::print(
        "step {:.3f} ms (median of the {} steps after the warm-up step, which took {:.3f} ms; min "
        "{:.3f}, max {:.3f}), {:.1f} samples/s\n",
        step_s * 1e3, sorted.size(), report.step_s.front() * 1e3, sorted.front() * 1e3,
        sorted.back() * 1e3, samples_per_s);
  else
    fmt::print(
        "step {:.3f} ms (one step, the warm-up step, slower than a steady one: --steps 3 or more "
        "for a median without it), {:.1f} samples/s\n",
        step_s * 1e3, samples_per_s);
  fmt::print("bubble {:.1f}% measured, {:.1f}% predicted (predicted step {:.3f} ms by {})\n",
             report.bubble_fraction * 100, plan.predicted.bubble_fraction * 100,
             plan.predicted.step_ms, plan.cost_model);
  if (!gap.empty()) fmt::print("prediction: {}\n", gap);
  fmt::print("{:>6}  {:>6}  {:>12}  {:>14}\n", "device", "busy", "peak memory", "predicted peak");
  for (size_t d = 0; d < report.devices.size(); ++d) {
    const rt::DeviceReport& r = report.devices[d];
    fmt::print("{:>6}  {:>5.1f}%  {:>12}  {:>14}\n", d, step_s > 0 ? 100 * r.busy_s / step_s : 0.0,
               dump::format_bytes(static_cast<double>(r.peak_bytes)),
               dump::format_bytes(static_cast<double>(r.predicted_peak_bytes)));
    if (r.device_peak_bytes >= 0)
      fmt::print(
          "        the GPU it is on: pool peak {} with the arena, {} in use (driver)\n",
          dump::format_bytes(static_cast<double>(r.device_peak_bytes)),
          dump::format_bytes(static_cast<double>(std::max<int64_t>(0, r.device_used_bytes))));
  }
  if (plan.data_parallel > 1 && plan.training && !report.allreduce_s.empty()) {
    double sum = 0;
    for (double s : report.allreduce_s) sum += s;
    const double mean = sum / static_cast<double>(report.allreduce_s.size());
    fmt::print(
        "all-reduce over {} replicas: {:.3f} ms of the step per device waiting for it ({:.1f}%; "
        "the sums run behind the backward; predicted {:.3f} ms on the link)\n",
        plan.data_parallel, mean * 1e3, step_s > 0 ? 100 * mean / step_s : 0.0, [&] {
          double predicted = 0;
          for (const plan::Stage& st : plan.stages) predicted += st.allreduce_ms;
          return predicted / plan.devices;
        }());
  }
  // The meter counts tensors; the process also holds the program, oneDNN's scratch and
  // buffers kept for reuse.
  fmt::print("process peak RSS {} (all devices, with the loaded programs)\n",
             dump::format_bytes(static_cast<double>(peak_rss_bytes())));
  for (const auto& o : outputs) fmt::print("wrote {}\n", o["file"].get<std::string>());
}

}  // namespace stagecraft::tools
