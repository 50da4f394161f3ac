#include "tools/stagec_calibrate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "cost_models/calibration.h"
#include "cost_models/profile_db.h"
#include "runtime/format/error.h"
#include "tools/dump/measured.h"
#include "tools/dump/view.h"

namespace stagecraft::tools {
namespace {

/// The steps after the first (the warm-up) as the fit reads them: with 4 or more, the middle
/// half by step time (from the first quartile to the third), so that a step another process
/// slowed, or one that ran alone on an idle machine, does not move the fit off the typical step.
/// `lengths_ms`: each one's measured length, in the same order.
std::vector<cost::TracedStep> steady_steps(const dump::MeasuredRun& run,
                                           std::vector<double>& lengths_ms) {
  std::vector<std::size_t> order;
  for (std::size_t k = 1; k < run.steps.size(); ++k) order.push_back(k);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return run.steps[a].end_s - run.steps[a].start_s < run.steps[b].end_s - run.steps[b].start_s;
  });
  const std::size_t n = order.size(), drop = n >= 4 ? n / 4 : 0;
  std::vector<cost::TracedStep> steps;
  for (std::size_t i = drop; i < n - drop; ++i) {
    cost::TracedStep step;
    lengths_ms.push_back(run.steps[order[i]].runtime_ms);
    for (const dump::MeasuredEvent& m : run.steps[order[i]].events) {
      const schedule::TimelineEvent& e = m.event;
      step.push_back({e.op, e.device, e.stage, e.microbatch, e.start_s, e.end_s, m.recompute});
    }
    steps.push_back(std::move(step));
  }
  // A trace that does not hold the runtime's step lengths (written before it kept them): no
  // step overhead.
  if (std::any_of(lengths_ms.begin(), lengths_ms.end(), [](double ms) { return ms < 0; }))
    lengths_ms.clear();
  return steps;
}

}  // namespace

void calibrate(const std::string& plan_dir, const std::string& trace_path,
               const std::string& db_path) {
  const dump::PlanView view = dump::load_view(plan_dir);
  const plan::Plan& plan = view.plan;
  if (plan.cost_model.rfind("measured(", 0) != 0)
    fail(ErrorKind::kUsage,
         "--calibrate: {} was planned with the cost model '{}'; calibration applies to plans "
         "made with --profile cpu (measured times)",
         plan_dir, plan.cost_model);
  std::error_code exists_error;
  if (!std::filesystem::is_regular_file(trace_path, exists_error))
    fail(ErrorKind::kIo, "--calibrate {}: no such file (stagerun {} --trace FILE writes one)",
         trace_path, plan_dir);
  // Refuses a run of another plan: devices, every device's instructions in schedule order.
  const dump::MeasuredRun run = dump::load_measured(trace_path, view);
  if (!run.traced)
    fail(ErrorKind::kUsage,
         "--calibrate {}: a stagerun --json run; give the file of stagerun {} --trace FILE",
         trace_path, plan_dir);
  if (run.steps.size() < 2)
    fail(ErrorKind::kUsage,
         "--calibrate {}: {} traced step{}; the fit leaves out the first, so it needs at least 2 "
         "(stagerun --steps 10 --trace FILE)",
         trace_path, run.steps.size(), run.steps.size() == 1 ? "" : "s");
  std::vector<cost::StagePrediction> predicted;
  for (const plan::Stage& st : plan.stages)
    predicted.push_back({st.fwd_ms, st.backward_input_ms, st.backward_weight_ms, st.optimizer_ms,
                         {}, st.recompute});
  // The ops each stage held: what the factors are carried by to a plan with other cuts.
  for (const plan::OpRecord& op : plan.ops)
    if (op.stage >= 0 && op.stage < static_cast<int>(predicted.size()))
      predicted[static_cast<std::size_t>(op.stage)].ops.push_back(
          {op.name, op.op_type, op.fwd_ms, op.bwd_ms});
  std::error_code ec;
  if (!std::filesystem::exists(db_path, ec))
    fail(ErrorKind::kUsage,
         "--profile-db {}: no such file; --calibrate adds to the database the plan was profiled "
         "with (give its --profile-db)",
         db_path);
  cost::ProfileDb db = cost::ProfileDb::load(db_path);
  cost::InstructionTerms fallback;
  fallback.instruction_ms = db.instruction_ms();
  std::vector<double> lengths_ms;
  const std::vector<cost::TracedStep> steps = steady_steps(run, lengths_ms);
  cost::InstructionTerms terms = cost::fit_calibration(
      steps, predicted, schedule::link_capacity(view.shape), fallback, lengths_ms);
  terms.trace = trace_path;
  terms.measured_step_ms = run.reported_step_ms();
  const std::string key = cost::calibration_key(
      plan.model_hash, plan.training, std::string(stagecraft::to_string(plan.schedule)),
      plan.devices, plan.chunks, plan.microbatches, plan.batch);
  std::vector<std::string> kinds;
  for (const auto& [kind, ms] : terms.instruction_ms)
    kinds.push_back(fmt::format("{} {:.4f}", kind, ms));
  fmt::print(
      "calibrated {} from {}: {} steady steps, median step {:.3f} ms (plan predicted {:.3f} ms)\n",
      plan_dir, trace_path, terms.steps, terms.measured_step_ms, plan.predicted.step_ms);
  fmt::print("  fixed cost per instruction (ms): {}; a step beyond its instructions {:.4f} ms\n",
             fmt::join(kinds, ", "), terms.step_overhead_ms);
  for (std::size_t k = 0; k < terms.stage_factors.size(); ++k) {
    std::vector<std::string> factors;
    for (const auto& [kind, f] : terms.stage_factors[k])
      factors.push_back(fmt::format("{} x{:.3f}", kind, f));
    fmt::print("  stage {}: {}\n", k,
               factors.empty() ? "no compute traced" : fmt::format("{}", fmt::join(factors, ", ")));
  }
  if (terms.follows_ops())
    fmt::print("  the factors follow the ops: {}\n", plan::describe_op_factors(terms.op_factors));
  db.put_calibration(key, std::move(terms));
  db.save(db_path);
  fmt::print("kept in {} under \"{}\"; plan again with --profile cpu --profile-db {} to use it\n",
             db_path, key, db_path);
}

}  // namespace stagecraft::tools
