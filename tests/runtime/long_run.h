#pragma once
/// \file
/// Long training runs in the test's own process, for issue 35's memory and step-time checks
/// (preempt_test.cpp's short one, soak_test.cpp's 20,000 steps).

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "tests/test_util.h"

namespace stagecraft::rt {

/// A 2-device training plan of toy.onnx (batch 8 in 2 microbatches, MSE loss, Adam) in `dir`.
inline std::string toy_training_plan(const testing::TempDir& dir) {
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/toy.onnx";
  o.devices = 2;
  o.batch = 8;
  o.microbatches = 2;
  o.training = true;
  o.optimizer = stagecraft::parse_optimizer("adam");
  o.loss.kind = "mse";
  o.device_spec = "cpu";
  const std::string path = dir.file("train");
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, path);
  return path;
}

/// The process's resident set now (/proc/self/status VmRSS), in bytes.
inline int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmRSS:")) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

/// What `long_run` measured: the resident growth from step 100 to the last, as a fraction of
/// the resident set after step 100, and every step's time.
struct LongRun {
  double growth = 0;
  std::vector<double> step_s;
};

/// Trains the toy plan in this process for `steps` (> 100) steps untraced.
inline LongRun long_run(int steps) {
  testing::TempDir dir;
  auto pipeline = Pipeline::load(toy_training_plan(dir), cpu_backend(), 1);
  RunOptions options;
  options.steps = steps;
  options.trace_steps = 0;
  int64_t at_100 = 0, at_end = 0;
  options.progress = [&](int done, int total, double) {
    if (done == 100) at_100 = resident_bytes();
    if (done == total) at_end = resident_bytes();
  };
  RunReport report = pipeline->run(pipeline->synthetic_inputs(), options);
  MESSAGE(fmt::format("{} steps: resident {} bytes after step 100, {} after the last", steps,
                      at_100, at_end));
  REQUIRE(at_100 > 0);
  return {static_cast<double>(at_end - at_100) / static_cast<double>(at_100), report.step_s};
}

/// The median of `values` (the upper middle one of an even count).
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace stagecraft::rt
