// The planner's split: the slowest-stage optimum refined by simulating candidates (never slower
// than the baselines it prints), and memory checked per device with all of its chunks together.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "compiler/plan/device_memory.h"
#include "compiler/plan/planner.h"
#include "compiler/schedule/simulator.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

/// `model` on `devices` devices under `schedule` (training with an MSE loss unless inference),
/// 2 microbatches per device of 2 samples each.
PlanOptions options(const std::string& model, int devices, const std::string& schedule) {
  PlanOptions o;
  o.model_path = sample(model);
  o.devices = devices;
  o.schedule = stagecraft::parse_schedule(schedule);
  o.training = schedule != "inference";
  if (o.training) o.loss.kind = "mse";
  o.microbatches = 2 * devices;
  o.batch = 4 * devices;
  if (model == "gpt_tiny.onnx") o.dims["seq"] = 16;
  return o;
}

/// A device spec like the CPU's with `bytes` of memory, written into `dir`.
schedule::PipelineShape shape_of(const Plan& p) {
  return {p.devices, p.chunks, p.microbatches, p.training};
}

TEST_CASE("the split search's lower-bound pruning changes no choice, only the work") {
  // Every sample and schedule, with the bound pruning and without: the same cuts, the same
  // prediction to the bit, and the pruned plans simulate fewer splits (all of them together).
  int pruned = 0, simulated_with = 0, simulated_without = 0;
  for (std::string model : {"mnist_cnn.onnx", "resnet_small.onnx", "gpt_tiny.onnx"}) {
    for (std::string schedule : {"gpipe", "1f1b", "interleaved", "zb-h1", "inference"}) {
      for (int devices : {2, 4}) {
        CAPTURE(model);
        CAPTURE(schedule);
        CAPTURE(devices);
        PlanOptions o = options(model, devices, schedule);
        o.microbatches = 2;  // few microbatches: the splits' steps differ by the fill and drain
        o.batch = 4;
        if (schedule == "interleaved" && o.microbatches % devices != 0) continue;
        PlannedModel with, without;
        try {
          with = make_plan(o);
        } catch (const Error& e) {
          CHECK_THROWS(make_plan([&] { o.prune_split_search = false; return o; }()));
          continue;
        }
        o.prune_split_search = false;
        without = make_plan(o);
        CHECK(with.plan.predicted.split_after == without.plan.predicted.split_after);
        CHECK(with.plan.predicted.step_ms == without.plan.predicted.step_ms);
        CHECK(with.plan.predicted.peak_memory_bytes == without.plan.predicted.peak_memory_bytes);
        CHECK(without.plan.search.pruned == 0);
        pruned += with.plan.search.pruned;
        simulated_with += with.plan.search.candidates;
        simulated_without += without.plan.search.candidates;
      }
    }
  }
  MESSAGE(pruned << " splits pruned; " << simulated_with << " simulated with pruning, "
                 << simulated_without << " without");
  CHECK(pruned > 0);
  CHECK(simulated_with < simulated_without);
}

TEST_CASE("the chosen split's step is never longer than a baseline's that fits, on every sample") {
  int plans = 0, shorter_than_bottleneck = 0, tie_breaks = 0;
  for (std::string model : {"toy.onnx", "mnist_cnn.onnx", "resnet_small.onnx", "gpt_tiny.onnx"}) {
    for (std::string schedule : {"gpipe", "1f1b", "interleaved", "zb-h1", "inference"}) {
      for (int devices : {1, 2, 4}) {
        CAPTURE(model);
        CAPTURE(schedule);
        CAPTURE(devices);
        PlannedModel planned;
        try {
          planned = make_plan(options(model, devices, schedule));
        } catch (const Error& e) {
          // Only a model with fewer ops than stages may be refused.
          CHECK_MESSAGE(std::string(e.what()).find("every stage needs an op") != std::string::npos,
                        e.what());
          continue;
        }
        const Plan& p = planned.plan;
        ++plans;
        CHECK(p.predicted.fits);
        CHECK(p.search.candidates >= 1);
        // Within 1% of each: the tie-break may take a split up to 1% slower than the fastest
        // found when its cuts send fewer bytes (and says so in its stage's `why`).
        bool tie_broken = false;
        for (const Stage& st : p.stages)
          tie_broken = tie_broken || st.why.find("within 1%") != std::string::npos;
        tie_breaks += tie_broken ? 1 : 0;
        const double slack = tie_broken ? 1.01 : 1 + 1e-9;
        for (const Prediction* baseline : {&p.baseline_parameters, &p.baseline_uniform}) {
          if (!baseline->fits) continue;
          CHECK(p.predicted.step_ms <= baseline->step_ms * slack);
        }
        REQUIRE(p.search.bottleneck_step_ms > 0);
        if (p.search.bottleneck_fits)
          CHECK(p.predicted.step_ms <= p.search.bottleneck_step_ms * slack);
        if (p.predicted.step_ms < p.search.bottleneck_step_ms * (1 - 1e-9))
          ++shorter_than_bottleneck;
        CHECK(p.search.bottleneck_split_after.size() == p.stages.size() - 1);
        CHECK_NOTHROW(validate_plan(p, "plan.json"));
      }
    }
  }
  MESSAGE(plans << " plans; the search beat the slowest-stage optimum in "
                << shorter_than_bottleneck << "; the bytes tie-break chose " << tie_breaks);
  CHECK(plans >= 50);
  CHECK(shorter_than_bottleneck > 0);
  CHECK(tie_breaks > 0);  // the samples have cuts within 1% that send fewer bytes (resnet_small)
}

TEST_CASE("a node computed from weights alone stays with the stage that reads it") {
  // An exporter's Linear: MatMul(x, Transpose(W)). Ready from the start, each Transpose came
  // first in the order, so a cut before its reader sent the transposed weight every microbatch
  // (and its gradient back). It now sits right before its reader, with no cut between them.
  testing::TempDir dir;
  onnx::ModelProto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)
      ->set_dim_value(64);
  std::string x = "x";
  for (int k = 0; k < 6; ++k) {
    const std::string n = std::to_string(k);
    testing::add_float_initializer(g, "W" + n, {64, 64});
    testing::add_node(g, "Transpose", {"W" + n}, {"t" + n}, "/fc" + n + "/Transpose");
    testing::add_node(g, "MatMul", {x, "t" + n}, {"h" + n}, "/fc" + n + "/MatMul");
    testing::add_node(g, "Relu", {"h" + n}, {"r" + n}, "/fc" + n + "/Relu");
    x = "r" + n;
  }
  testing::add_tensor_info(g->add_output(), x, onnx::TensorProto::FLOAT, {-1, 64}, {"batch"});
  testing::write_model(m, dir.file("linears.onnx"));
  for (int devices : {2, 3, 4}) {
    CAPTURE(devices);
    PlanOptions o;
    o.model_path = dir.file("linears.onnx");
    o.devices = devices;
    o.training = true;
    o.loss.kind = "mse";
    o.batch = 4 * devices;
    o.microbatches = 2 * devices;
    o.schedule = stagecraft::parse_schedule("1f1b");
    const Plan p = make_plan(o).plan;
    int transposes = 0;
    for (const Stage& st : p.stages) {
      for (const plan::StageTensor& t : st.inputs) {
        CAPTURE(t.name);
        CHECK_FALSE((t.peer_stage >= 0 && t.name.starts_with("t")));
      }
    }
    for (const plan::OpRecord& op : p.ops) transposes += op.op_type == "Transpose" ? 1 : 0;
    CHECK(transposes == 6);  // not folded away: each is trained through
  }
}

TEST_CASE("the search record goes through plan.json, which must have one") {
  Plan p = make_plan(options("toy.onnx", 2, "1f1b")).plan;
  CHECK(p.search.candidates > 1);
  nlohmann::json json = nlohmann::json::parse(to_json(p).dump());
  Plan back = plan_from_json(json, "plan.json");
  CHECK(back.search.candidates == p.search.candidates);
  CHECK(back.search.bottleneck_step_ms == doctest::Approx(p.search.bottleneck_step_ms));
  CHECK(back.search.bottleneck_split_after == p.search.bottleneck_split_after);
  json.erase("search");  // every format-4 plan has one
  CHECK_THROWS_WITH_AS(plan_from_json(json, "plan.json"),
                       doctest::Contains("plan.json: field 'search' is missing"), Error);
  json = nlohmann::json::parse(to_json(p).dump());
  json["search"]["bottleneck_split_after"] = {"no-such-node"};
  CHECK_THROWS_WITH_AS(validate_plan(plan_from_json(json, "plan.json"), "plan.json"),
                       doctest::Contains("search.bottleneck_split_after"), Error);
  // A manual split is checked and simulated, and has no slowest-stage optimum to beat.
  PlanOptions manual = options("toy.onnx", 2, "1f1b");
  manual.split_after = p.predicted.split_after;
  Plan pinned = make_plan(manual).plan;
  CHECK(pinned.search.bottleneck_step_ms == 0);
  CHECK(pinned.search.bottleneck_split_after.empty());
  CHECK(pinned.predicted.step_ms == doctest::Approx(p.predicted.step_ms));
}

TEST_CASE(
    "interleaved memory per device: the schedule's counts, at least the event peak, within 10%") {
  int devices_checked = 0;
  for (std::string model : {"mnist_cnn.onnx", "resnet_small.onnx", "gpt_tiny.onnx"}) {
    for (int devices : {1, 2, 4}) {
      for (std::string recompute : {"none", "all"}) {
        CAPTURE(model);
        CAPTURE(devices);
        CAPTURE(recompute);
        PlanOptions o = options(model, devices, "interleaved");
        o.microbatches = 4 * devices;
        o.batch = 8 * devices;
        o.recompute = stagecraft::parse_recompute(recompute);
        PlannedModel planned;
        try {
          planned = make_plan(o);
        } catch (const Error& e) {
          CHECK_MESSAGE(std::string(e.what()).find("every stage needs an op") != std::string::npos,
                        e.what());
          continue;
        }
        const Plan& p = planned.plan;
        schedule::PipelineShape shape = shape_of(p);
        // Each chunk's anatomy counts what the schedule really holds for that chunk.
        std::vector<int64_t> counts = schedule::stage_in_flight_peaks(planned.schedule, shape);
        for (const Stage& st : p.stages) CHECK(st.in_flight == counts[st.index]);
        // The device check (its chunks together) against the simulator's peak by events, which
        // plan.json records with each device's working arena and buffers added.
        std::vector<DeviceMemory> checked = device_memory(p.stages, planned.schedule, shape);
        REQUIRE(checked.size() == p.predicted.device_peak_bytes.size());
        for (const DeviceMemory& d : checked) {
          const auto simulated = static_cast<double>(p.predicted.device_peak_bytes[d.device]);
          CAPTURE(d.device);
          CHECK(static_cast<double>(d.total()) >= simulated - 16);
          CHECK(static_cast<double>(d.total()) <= 1.10 * simulated);
          int64_t chunks_alone = 0;
          for (int k : d.stages) chunks_alone += p.stages[k].memory.total();
          CHECK(d.total() <= chunks_alone);
          ++devices_checked;
        }
      }
    }
  }
  CHECK(devices_checked >= 20);
}

TEST_CASE("an interleaved device is checked with its chunks together, not each in 1/V of it") {
  // The toy's first Gemm holds most of the parameters: a device that holds its chunk beside a
  // small one has room, though that chunk alone needs more than half the device.
  PlanOptions o = options("toy.onnx", 2, "interleaved");
  o.device_spec = "cpu";
  PlannedModel roomy = make_plan(o);
  std::vector<DeviceMemory> need =
      device_memory(roomy.plan.stages, roomy.schedule, shape_of(roomy.plan));
  int64_t device_need = 0, largest_stage = 0;
  for (const DeviceMemory& d : need) device_need = std::max(device_need, d.total());
  for (const Stage& st : roomy.plan.stages)
    largest_stage = std::max(largest_stage, st.memory.total());
  const int64_t capacity = device_need + device_need / 20;
  CAPTURE(device_need);
  CAPTURE(largest_stage);
  REQUIRE(2 * largest_stage > capacity);  // 1/V of the device would not hold that stage
  testing::TempDir dir;
  o.device_spec = testing::device_file(dir, capacity);
  PlannedModel tight = make_plan(o);
  CHECK(tight.plan.predicted.fits);
  for (const DeviceMemory& d :
       device_memory(tight.plan.stages, tight.schedule, shape_of(tight.plan)))
    CHECK(d.total() <= capacity);
  // Below what any split needs, the refusal names the device, its stages and the numbers.
  o.device_spec = testing::device_file(dir, largest_stage / 2);
  try {
    make_plan(o);
    FAIL("a device of half the largest stage held the plan");
  } catch (const Error& e) {
    std::string what = e.what();
    INFO(what);
    CHECK(what.find("no split into 4 stages fits") != std::string::npos);
    CHECK(what.find("device has") != std::string::npos);
  }
}

}  // namespace
}  // namespace stagecraft::plan
