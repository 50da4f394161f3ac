// Plans run end to end: for every sample and 1, 2 and 4 devices, the pipelined run's outputs
// equal those of the unpartitioned model run on one device, microbatch by microbatch; a plan
// the runtime cannot trust is refused before anything runs; a failing worker stops them all.
#include "runtime/exec/pipeline.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "compiler/ir/onnx_bridge.h"
#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

plan::PlanOptions options_for(const std::string& model, int devices) {
  plan::PlanOptions o;
  o.model_path = sample(model);
  o.devices = devices;
  o.microbatches = 4;
  o.batch = model == "gpt_tiny.onnx" ? 8 : 8;
  if (model == "gpt_tiny.onnx") o.dims["seq"] = 16;
  o.device_spec = "cpu";
  return o;
}

// Largest |a - b| over two float tensors of one shape.
double max_difference(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape == b.shape);
  REQUIRE(a.dtype == DType::kFloat32);
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(a.as<float>()[i] - b.as<float>()[i])));
  return worst;
}

TEST_CASE("pipelined runs equal the unpartitioned model, microbatch by microbatch") {
  struct Case {
    std::string model;
    std::vector<int> devices;
  };
  // toy has three ops, so it cannot fill four stages.
  const Case cases[] = {{"toy.onnx", {1, 2, 3}},
                        {"mnist_cnn.onnx", {1, 2, 4}},
                        {"resnet_small.onnx", {1, 2, 4}},
                        {"gpt_tiny.onnx", {1, 2, 4}}};
  for (const Case& c : cases) {
    for (int devices : c.devices) {
      CAPTURE(c.model);
      CAPTURE(devices);
      testing::TempDir dir;
      plan::PlannedModel planned = plan::make_plan(options_for(c.model, devices));
      REQUIRE(planned.plan.stages.size() == static_cast<size_t>(devices));
      plan::write_plan(planned, dir.file("plan"));

      auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
      std::map<std::string, Tensor> inputs = pipeline->synthetic_inputs();
      RunReport report = pipeline->run(inputs, RunOptions{});

      // The reference: the whole model (imported at the microbatch size) as one program.
      Program whole =
          Program::from_model(ir::model_from_graph(planned.model.graph), cpu_backend(), c.model);
      auto device = cpu_backend().make_device(0, 1);
      std::vector<std::byte> arena(static_cast<size_t>(whole.arena_bytes()) + 64);
      const int M = planned.plan.microbatches;
      for (int mb = 0; mb < M; ++mb) {
        std::vector<Tensor> args;
        for (const ValueInfo& in : whole.inputs()) {
          const Tensor& batch = inputs.at(in.name);
          args.push_back(slice_rows(batch, mb * in.shape[0], (mb + 1) * in.shape[0]));
        }
        std::vector<Tensor> want = whole.run(*device, args, arena.data());
        for (size_t k = 0; k < want.size(); ++k) {
          const std::string& name = whole.outputs()[k].name;
          REQUIRE(report.outputs.count(name) == 1);
          const Tensor& got = report.outputs.at(name);
          int64_t rows = want[k].shape[0];
          CHECK(max_difference(slice_rows(got, mb * rows, (mb + 1) * rows), want[k]) <= 1e-5);
        }
      }
      // Every device ran, and the meter saw at least its weights and arena.
      // The plan's peak bounds it: weights, arena, two receive buffers and the outputs until
      // sent or handed back (the last device's too: they were once left out of its count).
      // The runtime also holds the stage's few non-float constants (shape operands: 2.4 KiB on
      // gpt_tiny), which the plan leaves out. Below the bound by at most the second receive
      // buffer, which holds a message only when the previous device ran ahead.
      for (const DeviceReport& d : report.devices) {
        CAPTURE(d.peak_bytes);
        CAPTURE(d.predicted_peak_bytes);
        CHECK(d.busy_s > 0);
        CHECK(d.peak_bytes >= d.weight_bytes + d.arena_bytes);
        CHECK(d.peak_bytes <= d.predicted_peak_bytes + 4096);
        CHECK(static_cast<double>(d.predicted_peak_bytes - d.peak_bytes) <=
              0.35 * static_cast<double>(d.predicted_peak_bytes));
      }
      // A forward per device and microbatch, the receives' waits of every device but the
      // first and the sends of every device but the last.
      auto count = [&](schedule::Op op) {
        return std::count_if(report.events.begin(), report.events.end(),
                             [op](const schedule::TimelineEvent& e) { return e.op == op; });
      };
      CHECK(count(schedule::Op::kForward) == devices * M);
      CHECK(count(schedule::Op::kSendAct) == (devices - 1) * M);
      CHECK(report.events.size() == static_cast<size_t>(devices * M + 2 * (devices - 1) * M));
      // The memory track: each device's meter at the step's start and after each of its
      // instructions, in time order, between its weights and arena and its measured peak.
      for (int d = 0; d < devices; ++d) {
        CAPTURE(d);
        const DeviceReport& r = report.devices[static_cast<size_t>(d)];
        std::vector<MemorySample> track;
        for (const MemorySample& m : report.memory)
          if (m.device == d) track.push_back(m);
        CHECK(track.size() == pipeline->schedule()[static_cast<size_t>(d)].size() + 1);
        for (size_t i = 0; i < track.size(); ++i) {
          CHECK(track[i].bytes >= r.weight_bytes + r.arena_bytes);
          CHECK(track[i].bytes <= r.peak_bytes);
          if (i > 0) CHECK(track[i].time_s >= track[i - 1].time_s);
        }
      }
    }
  }
}

TEST_CASE("a failing worker stops every worker and its error is the one reported") {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(options_for("resnet_small.onnx", 4));
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  // A node of stage 2: devices 0 and 1 are upstream (they would block on full channels or the
  // step barrier), device 3 waits for data that never comes.
  std::string victim = planned.plan.stages[2].nodes.front();
  RunOptions options;
  options.steps = 3;
  options.inject_fault = victim;
  CHECK_THROWS_WITH_AS(pipeline->run(pipeline->synthetic_inputs(), options),
                       doctest::Contains("device 2: step 1: FWD stage 2 mb 0: "), Error);
  CHECK_THROWS_WITH_AS(pipeline->run(pipeline->synthetic_inputs(), options),
                       doctest::Contains(fmt::format("node '{}'", victim).c_str()), Error);
}

TEST_CASE("a plan the runtime cannot trust is refused before anything runs") {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(options_for("mnist_cnn.onnx", 2));
  std::string plan_dir = dir.file("plan");
  plan::write_plan(planned, plan_dir);

  SUBCASE("a stage file that does not match its hash") {
    std::ofstream(plan_dir + "/stage_1.onnx", std::ios::app) << "x";
    CHECK_THROWS_WITH_AS(Pipeline::load(plan_dir, cpu_backend(), 1),
                         doctest::Contains("stage_1.onnx"), Error);
  }
  SUBCASE("a plan whose predicted peak exceeds this machine's memory") {
    nlohmann::json json = nlohmann::json::parse(std::ifstream(plan_dir + "/plan.json"));
    // Device 1's peak, everywhere plan.json has it (the validator holds them to one number).
    const int64_t huge = int64_t{1} << 62;
    nlohmann::json& device = json["device_memory"][1];
    device["parts"]["activations"] =
        device["parts"]["activations"].get<int64_t>() + huge - device["peak_bytes"].get<int64_t>();
    device["peak_bytes"] = huge;
    device["time_ms"].push_back(device["time_ms"].back());
    device["bytes"].push_back(huge);
    json["predicted"]["device_peak_bytes"][1] = huge;
    json["predicted"]["peak_memory_bytes"] = huge;
    // Sealed again as stagec would: the capacity check is what is tested.
    std::ofstream(plan_dir + "/plan.json")
        << plan::plan_json_text(nlohmann::ordered_json::parse(json.dump()));
    CHECK_THROWS_WITH_AS(
        Pipeline::load(plan_dir, cpu_backend(), 1),
        doctest::Contains("plan.json: devices 0, 1 share it and are predicted to peak at "
                          "4611686018427"),
        Error);
  }
  SUBCASE("a plan.json changed after stagec wrote it") {
    // Issue 17: plan.json was not hashed, so an edit every check accepts ran as written.
    nlohmann::json json = nlohmann::json::parse(std::ifstream(plan_dir + "/plan.json"));
    const std::string recorded = json["plan_hash"];
    json["cost_model"] = "roofline(a faster device, fp32)";  // no check reads it
    std::ofstream(plan_dir + "/plan.json") << json.dump(1);
    CHECK_THROWS_WITH_AS(
        Pipeline::load(plan_dir, cpu_backend(), 1),
        doctest::Contains(fmt::format("plan.json: the content hashes to fnv1a64:").c_str()), Error);
    CHECK_THROWS_WITH_AS(
        Pipeline::load(plan_dir, cpu_backend(), 1),
        doctest::Contains(fmt::format("but its field 'plan_hash' is {}: the file was changed "
                                      "after stagec wrote it",
                                      recorded)
                              .c_str()),
        Error);
    json.erase("plan_hash");
    std::ofstream(plan_dir + "/plan.json") << json.dump(1);
    CHECK_THROWS_WITH_AS(Pipeline::load(plan_dir, cpu_backend(), 1),
                         doctest::Contains("plan.json: field 'plan_hash' is missing"), Error);
  }
  SUBCASE("plan.json and schedule.json re-indented still load") {
    for (const char* file : {"/plan.json", "/schedule.json"}) {
      nlohmann::json json = nlohmann::json::parse(std::ifstream(plan_dir + file));
      std::ofstream(plan_dir + file) << json.dump(4);
    }
    CHECK_NOTHROW(Pipeline::load(plan_dir, cpu_backend(), 1));
  }
  SUBCASE("a schedule.json changed after stagec wrote it") {
    nlohmann::json json = nlohmann::json::parse(std::ifstream(plan_dir + "/schedule.json"));
    // Device 0's second forward moved before its first send: a schedule the validator accepts.
    auto& device0 = json["devices"][0]["instructions"];
    REQUIRE(device0.size() >= 3);
    std::swap(device0[1], device0[2]);
    std::ofstream(plan_dir + "/schedule.json") << json.dump(1);
    CHECK_THROWS_WITH_AS(Pipeline::load(plan_dir, cpu_backend(), 1),
                         doctest::Contains("schedule.json: the content hashes to fnv1a64:"), Error);
  }
  SUBCASE("a missing schedule") {
    fs::remove(plan_dir + "/schedule.json");
    CHECK_THROWS_WITH_AS(Pipeline::load(plan_dir, cpu_backend(), 1),
                         doctest::Contains("schedule.json: cannot open"), Error);
  }
  SUBCASE("inputs of the wrong shape or dtype") {
    auto pipeline = Pipeline::load(plan_dir, cpu_backend(), 1);
    std::map<std::string, Tensor> inputs = pipeline->synthetic_inputs();
    const ModelTensor& in = pipeline->inputs().front();
    inputs[in.name] = Tensor::owned(DType::kFloat32, {3, 1, 28, 28});
    CHECK_THROWS_WITH_AS(
        pipeline->check_inputs(inputs),
        doctest::Contains(
            fmt::format("input '{}' is float32[3, 1, 28, 28] but the plan takes", in.name).c_str()),
        Error);
    inputs[in.name] = Tensor::owned(DType::kInt64, {8, 1, 28, 28});
    CHECK_THROWS_AS(pipeline->check_inputs(inputs), Error);
    inputs.erase(in.name);
    CHECK_THROWS_WITH_AS(pipeline->check_inputs(inputs), doctest::Contains("is not given"), Error);
  }
}

}  // namespace
}  // namespace stagecraft::rt
