#pragma once
/// \file
/// What the pipelined training tests start from: their plan options, and a plan trained on
/// synthetic inputs.

#include <memory>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/vocabulary.h"
#include "samples/builder/sample_models.h"

namespace stagecraft::testing {

/// Trains `model` (a path) on `devices` with the cpu device spec: batch 8 in 4 microbatches,
/// `schedule` (a --schedule name), Adam at lr 0.01, the `loss` loss (a --loss name).
inline plan::PlanOptions training_options(const std::string& model, int devices,
                                          const std::string& schedule, const std::string& loss) {
  plan::PlanOptions o;
  o.model_path = model;
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  o.training = true;
  o.schedule = parse_schedule(schedule);
  o.optimizer = OptimizerKind::kAdam;
  o.training_config.lr = 0.01;
  o.loss.kind = loss;
  o.device_spec = "cpu";
  return o;
}

/// The small GPT whose output head is tied to its token embedding (a Transpose of
/// transformer.wte.weight) that the shared-weight and fused-attention tests train.
inline samples::GptOptions tied_gpt_options() {
  samples::GptOptions o;
  o.layers = 2;
  o.width = 32;
  o.heads = 2;
  o.seq = 16;
  o.vocab = 64;
  o.tied = true;
  return o;
}

/// Plans `o` into `plan_dir` and loads the plan on the cpu backend.
inline std::unique_ptr<rt::Pipeline> load_plan(const plan::PlanOptions& o,
                                               const std::string& plan_dir) {
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, plan_dir);
  return rt::Pipeline::load(plan_dir, rt::cpu_backend(), 1);
}

/// Plans `o` into `plan_dir`, loads the plan on the cpu backend and trains it for `steps` steps on
/// its synthetic inputs: the losses.
inline std::vector<double> train_losses(const plan::PlanOptions& o, int steps,
                                        const std::string& plan_dir) {
  auto pipeline = load_plan(o, plan_dir);
  rt::RunOptions options;
  options.steps = steps;
  return pipeline->run(pipeline->synthetic_inputs(), options).losses;
}

}  // namespace stagecraft::testing
