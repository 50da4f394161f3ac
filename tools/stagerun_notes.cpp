// stagerun's notes on a run (stagerun_notes.h).
#include "tools/stagerun_notes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "tools/dump/view.h"

namespace stagecraft::tools {

void report_loads(const rt::Pipeline& pipeline) {
  std::map<int, rt::Pipeline::StageLoad> per_device;
  bool worth_saying = false;
  for (const rt::Pipeline::StageLoad& load : pipeline.loads()) {
    rt::Pipeline::StageLoad& d = per_device[load.device];
    d.device = load.device;
    d.bytes += load.bytes;
    d.weight_bytes += load.weight_bytes;
    d.seconds += load.seconds;
    worth_saying |= load.seconds >= 1.0 || load.bytes >= (int64_t{256} << 20);
  }
  if (!worth_saying) return;
  for (const auto& [device, d] : per_device)
    fmt::print(stderr, "stagerun: device {} loaded {} of weights ({} read from weight files) in {:.2f} s\n",
               device, dump::format_bytes(static_cast<double>(d.weight_bytes)),
               dump::format_bytes(static_cast<double>(d.bytes)), d.seconds);
}

namespace {

/// The distinct processors the plan puts its devices on.
int plan_processors(const plan::Plan& plan) {
  return static_cast<int>(
      std::set<int>(plan.processors.processor_of.begin(), plan.processors.processor_of.end())
          .size());
}

/// The cause "the devices share cores" for `threads` worker threads on `cores`, or "" when the
/// plan counted its devices sharing as many processors as the cores give.
std::string cores_cause(const plan::Plan& plan, int devices, int threads_per_device, int cores) {
  const int threads = devices * threads_per_device;
  if (cores <= 0 || threads <= cores) return "";
  const int at_once = std::max(1, cores / std::max(1, threads_per_device));
  if (plan_processors(plan) <= at_once) return "";
  const int per_processor = std::min(plan.devices, (plan.devices + at_once - 1) / at_once);
  return fmt::format(
      "{} worker threads on {} cores: the devices share cores, but the predicted step {:.3f} ms "
      "has its {} devices compute on {} processors at once; stagec --devices-per-processor {} "
      "predicts this machine",
      threads, cores, plan.predicted.step_ms, plan.devices, plan_processors(plan), per_processor);
}

}  // namespace

std::string prediction_gap(const rt::RunReport& report, const plan::Plan& plan,
                           std::string_view backend, int devices, int threads_per_device,
                           const std::vector<std::string>& warnings) {
  const double predicted = plan.predicted.step_ms / 1e3;
  const double measured = report.step_s.empty() ? 0 : report.step_s[report.reported_step];
  if (predicted <= 0 || measured <= 0) return "";
  const double ratio = measured / predicted;
  if (ratio <= 1.5 && ratio >= 1 / 1.5) return "";
  std::vector<std::string> causes;
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  if (std::string shared = cores_cause(plan, devices, threads_per_device, cores);
      backend == "cpu" && !shared.empty())
    causes.push_back(std::move(shared));
  double load = 0;
  if (std::ifstream loadavg("/proc/loadavg"); loadavg >> load && cores > 0 && load > cores)
    causes.push_back(fmt::format("a loaded machine: 1-minute load {:.1f} on {} cores", load, cores));
  for (const std::string& w : warnings)
    causes.push_back(w.find("costed for") != std::string::npos
                         ? "the plan was costed for another device (warning above)"
                     : w.find("each on its own") != std::string::npos
                         ? "the plan counts devices sharing a processor that do not here "
                           "(warning above)"
                         : "devices share a GPU (warning above)");
  if (plan.cost_model.starts_with("roofline") && backend == "cpu")
    causes.push_back("the roofline cost model: re-plan with stagec --profile cpu for measured kernel times");
  if (report.step_s.size() < 2) causes.push_back("only the warm-up step was measured: --steps 3 or more");
  if (causes.empty()) causes.push_back("none stagerun can see");
  return fmt::format("measured step {:.3f} ms is {:.2f}x the predicted {:.3f} ms; likely: {}",
                     measured * 1e3, ratio, predicted * 1e3, fmt::join(causes, "; "));
}

}  // namespace stagecraft::tools
