#pragma once
/// \file
/// The plan options the pipelined training tests start from.

#include <string>

#include "compiler/plan/planner.h"
#include "runtime/format/vocabulary.h"

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

}  // namespace stagecraft::testing
