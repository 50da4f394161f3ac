// stagerun's warning when the GPUs a run shares are not the plan's processors (issue 33).
#include "runtime/core/shared_processors.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/runtime/fake_gpus.h"

namespace stagecraft::rt {
namespace {


/// A plan of `devices` at `per_processor` per processor: step 300 ms, 200 ms apart.
plan::Plan plan_of(int devices, int per_processor) {
  plan::Plan p;
  p.devices = devices;
  p.cluster.devices_per_processor = per_processor;
  p.processors.processor_of = plan::processor_of_devices(devices, per_processor);
  p.predicted.step_ms = 300;
  p.processors.separate_step_ms = per_processor > 1 ? 200 : 300;
  return p;
}

TEST_CASE(
    "a run that shares GPUs the plan kept apart names the predicted step that no longer holds") {
  const std::vector<int> two{0, 1}, four{0, 1, 2, 3};
  const std::string line = processor_warning(plan_of(2, 1), FakeGpus(1), two);
  CAPTURE(line);
  CHECK(line.starts_with("the plan's 2 devices run on 1 GPU (GPU 0 (fake))"));
  CHECK(
      line.ends_with("; its predicted step 300.000 ms has them compute on 2 processors at "
                     "once, which no longer holds here (stagec --devices-per-processor 2 "
                     "predicts this sharing)"));
  CHECK(line.find('\n') == std::string::npos);
  // Four devices on two GPUs: {0, 2} and {1, 3}, a plan of one per processor.
  CHECK(processor_warning(plan_of(4, 1), FakeGpus(2), four)
            .find("--devices-per-processor 2 predicts") != std::string::npos);
  // Planned as the run shares them: nothing to say.
  CHECK(processor_warning(plan_of(2, 2), FakeGpus(1), two).empty());
  CHECK(processor_warning(plan_of(4, 2), FakeGpus(2), four).empty());
  CHECK(processor_warning(plan_of(4, 1), FakeGpus(4), four).empty());
  // The CPU backend's devices are threads: stagerun weighs its cores apart.
  CHECK(processor_warning(plan_of(2, 1), cpu_backend(), two).empty());
}

TEST_CASE("a plan that shares processors run on GPUs of their own says its step is pessimistic") {
  const std::string line = processor_warning(plan_of(2, 2), FakeGpus(2), std::vector<int>{0, 1});
  CHECK(line ==
        "the plan has 2 devices per processor, but here its devices run on 2 GPUs, each on its "
        "own: its predicted step 300.000 ms counts turns that are not taken; expect nearer "
        "200.000 ms (stagec --devices-per-processor 1 predicts this machine)");
}

}  // namespace
}  // namespace stagecraft::rt
