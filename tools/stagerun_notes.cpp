// stagerun's notes on a run (stagerun_notes.h).
#include "tools/stagerun_notes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <map>
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

std::string prediction_gap(const rt::RunReport& report, const plan::Plan& plan,
                           std::string_view backend, int threads,
                           const std::vector<std::string>& warnings) {
  const double predicted = plan.predicted.step_ms / 1e3;
  const double measured = report.step_s.empty() ? 0 : report.step_s[report.reported_step];
  if (predicted <= 0 || measured <= 0) return "";
  const double ratio = measured / predicted;
  if (ratio <= 1.5 && ratio >= 1 / 1.5) return "";
  std::vector<std::string> causes;
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  if (backend == "cpu" && cores > 0 && threads > cores)
    causes.push_back(fmt::format("{} worker threads on {} cores: the devices share cores, which "
                                 "the prediction takes to run alone",
                                 threads, cores));
  double load = 0;
  if (std::ifstream loadavg("/proc/loadavg"); loadavg >> load && cores > 0 && load > cores)
    causes.push_back(fmt::format("a loaded machine: 1-minute load {:.1f} on {} cores", load, cores));
  for (const std::string& w : warnings)
    causes.push_back(w.find("costed for") != std::string::npos ? "the plan was costed for another device (warning above)"
                                                               : "devices share a GPU (warning above)");
  if (plan.cost_model.starts_with("roofline") && backend == "cpu")
    causes.push_back("the roofline cost model: re-plan with stagec --profile cpu for measured kernel times");
  if (report.step_s.size() < 2) causes.push_back("only the warm-up step was measured: --steps 3 or more");
  if (causes.empty()) causes.push_back("none stagerun can see");
  return fmt::format("measured step {:.3f} ms is {:.2f}x the predicted {:.3f} ms; likely: {}",
                     measured * 1e3, ratio, predicted * 1e3, fmt::join(causes, "; "));
}

}  // namespace stagecraft::tools
