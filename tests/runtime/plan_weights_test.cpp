// Issue 28: where a plan keeps its weights. Stage files are valid ONNX models whose large
// initializers are external data: windows of the model's own data file (referenced, not copied)
// or the stage's own stage_K.weights (an inline model, or --copy-weights). The runtime reads
// each stage's share straight into its tensors, checks it against plan.json, and refuses a
// missing, truncated or changed file before anything runs.
#include <doctest/doctest.h>
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "compiler/ir/onnx_bridge.h"
#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

plan::PlanOptions gpt_options(const std::string& model, int devices) {
  plan::PlanOptions o;
  o.model_path = model;
  o.devices = devices;
  o.microbatches = 2;
  o.batch = 4;
  o.dims["seq"] = 16;
  o.device_spec = "cpu";
  return o;
}

onnx::ModelProto read_model(const std::string& path) {
  onnx::ModelProto model;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(model.ParseFromIstream(&in));
  return model;
}

std::string location_of(const onnx::TensorProto& t) {
  for (const auto& e : t.external_data())
    if (e.key() == "location") return e.value();
  return "";
}

/// Every weight the pipeline loaded equals the model's own bytes (the graph planning imported).
void check_weights_equal(const Pipeline& pipeline, const plan::PlannedModel& planned) {
  int64_t compared = 0;
  for (const plan::Stage& stage : planned.plan.stages) {
    for (const auto& [name, t] : pipeline.stage_weights(stage.index)) {
      CAPTURE(name);
      const std::optional<ir::ValueId> id = planned.model.graph.find_value(name);
      REQUIRE(id.has_value());
      const auto bytes = planned.model.graph.value(*id).initializer->bytes();
      REQUIRE(static_cast<size_t>(t.bytes()) == bytes.size());
      CHECK(std::memcmp(t.data, bytes.data(), bytes.size()) == 0);
      compared += t.bytes();
    }
  }
  CHECK(compared > 0);
}

/// Outputs of the plan's run (synthetic inputs) against the whole model on one device; returns
/// the run's outputs.
std::map<std::string, Tensor> check_runs_like_whole(const std::string& plan_dir,
                                                    const plan::PlannedModel& planned) {
  auto pipeline = Pipeline::load(plan_dir, cpu_backend(), 1);
  check_weights_equal(*pipeline, planned);
  std::map<std::string, Tensor> inputs = pipeline->synthetic_inputs();
  RunReport report = pipeline->run(inputs, RunOptions{});
  Program whole =
      Program::from_model(ir::model_from_graph(planned.model.graph), cpu_backend(), "whole");
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(whole.arena_bytes()) + 64);
  const int64_t mb = planned.plan.microbatch_size;
  std::vector<Tensor> args;
  for (const ValueInfo& in : whole.inputs()) {
    const Tensor& batch = inputs.at(in.name);
    Tensor part = Tensor::owned(in.dtype, in.shape);
    std::memcpy(part.data, batch.data, static_cast<size_t>(part.bytes()));  // microbatch 0
    args.push_back(std::move(part));
  }
  std::vector<Tensor> expected = whole.run(*device, args, arena.data());
  const Tensor& got = report.outputs.at(whole.outputs().at(0).name);
  const Tensor& want = expected.at(0);
  REQUIRE(got.dtype == DType::kFloat32);
  REQUIRE(got.shape[0] == mb * planned.plan.microbatches);
  double worst = 0;  // microbatch 0: the leading rows
  for (int64_t i = 0; i < want.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(got.as<float>()[i] - want.as<float>()[i])));
  CHECK(worst <= 1e-5);
  return report.outputs;
}

TEST_CASE("an inline model's stage files keep their weights in their own weights files") {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(gpt_options(sample("gpt_tiny.onnx"), 2));
  plan::write_plan(planned, dir.file("plan"));
  plan::Plan loaded = plan::load_plan(dir.file("plan"));
  CHECK(loaded.weight_files.empty());
  for (const plan::Stage& stage : loaded.stages) {
    CAPTURE(stage.index);
    const std::string file = dir.file("plan/" + stage.file);
    CHECK_NOTHROW(onnx::checker::check_model(file));
    const onnx::ModelProto model = read_model(file);
    int64_t external = 0, embedded = 0;
    for (const onnx::TensorProto& t : model.graph().initializer()) {
      if (t.data_location() == onnx::TensorProto::EXTERNAL) {
        CHECK(location_of(t) == fs::path(stage.file).stem().string() + ".weights");
        ++external;
      } else {
        CHECK(t.raw_data().size() <= static_cast<size_t>(plan::kEmbeddedWeightBytes));
        ++embedded;
      }
    }
    CHECK(external > 0);
    CHECK(stage.weights_bytes > 0);
    CHECK(stage.weights_hash.starts_with("fnv1a64x4:"));
    // The stage file holds the graph; its weights file the bytes.
    CHECK(fs::file_size(file) < static_cast<uintmax_t>(stage.weights_bytes));
    CHECK(fs::file_size(dir.file("plan/" + fs::path(stage.file).stem().string() + ".weights")) >=
          static_cast<uintmax_t>(stage.weights_bytes));
  }
  check_runs_like_whole(dir.file("plan"), planned);
}

TEST_CASE("a model with external data is planned by reference, or copied with copy") {
  testing::TempDir dir;
  // The model in a folder of its own, so the test can change its data file.
  fs::create_directory(dir.file("model"));
  for (const auto& entry : fs::directory_iterator(sample("gpt_tiny_external")))
    fs::copy_file(entry.path(), dir.path() / "model" / entry.path().filename());
  const std::string model = dir.file("model/model.onnx");
  plan::PlannedModel planned = plan::make_plan(gpt_options(model, 2));

  SUBCASE("referenced: the plan names the model's data file and copies none of it") {
    plan::write_plan(planned, dir.file("plan"));
    plan::Plan loaded = plan::load_plan(dir.file("plan"));
    REQUIRE(loaded.weight_files.size() == 1);
    const plan::WeightFile& w = loaded.weight_files[0];
    CHECK(w.path == fs::canonical(dir.path() / "model").string() + "/" + fs::path(w.path).filename().string());
    CHECK(w.location.starts_with("model_weights/"));
    CHECK(w.bytes == static_cast<int64_t>(fs::file_size(w.path)));
    int64_t plan_bytes = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir.file("plan")))
      if (e.is_regular_file() && !e.is_symlink()) plan_bytes += static_cast<int64_t>(e.file_size());
    CAPTURE(plan_bytes);
    CHECK(plan_bytes < w.bytes / 4);
    int64_t referenced = 0;
    for (const plan::Stage& stage : loaded.stages) {
      const std::string file = dir.file("plan/" + stage.file);
      // ONNX's checker follows the link the writer left at the location.
      CHECK_NOTHROW(onnx::checker::check_model(file));
      const onnx::ModelProto model = read_model(file);
      for (const onnx::TensorProto& t : model.graph().initializer())
        if (t.data_location() == onnx::TensorProto::EXTERNAL && location_of(t) == w.location)
          ++referenced;
    }
    CHECK(referenced > 0);
    check_runs_like_whole(dir.file("plan"), planned);

    // A changed data file is refused before anything runs, with the file and the numbers.
    {
      std::fstream f(w.path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(w.bytes / 2));
      const char poke[4] = {1, 2, 3, 4};
      f.write(poke, sizeof poke);
    }
    CHECK_THROWS_WITH_AS(Pipeline::load(dir.file("plan"), cpu_backend(), 1),
                         doctest::Contains("a weight file changed since the plan was written"),
                         Error);
    fs::resize_file(w.path, static_cast<uintmax_t>(w.bytes - 8));
    const std::string truncated = fmt::format("is {} bytes but", w.bytes - 8);
    CHECK_THROWS_WITH_AS(Pipeline::load(dir.file("plan"), cpu_backend(), 1),
                         doctest::Contains(truncated.c_str()), Error);
    fs::remove(w.path);
    CHECK_THROWS_WITH_AS(Pipeline::load(dir.file("plan"), cpu_backend(), 1),
                         doctest::Contains("is missing (the model's external data"), Error);
  }

  SUBCASE("copied: the plan directory holds every weight and outlives the model") {
    plan::WeightWriting copy;
    copy.copy = true;
    plan::write_plan(planned, dir.file("plan"), copy);
    CHECK(plan::load_plan(dir.file("plan")).weight_files.empty());
    CHECK_FALSE(fs::exists(dir.file("plan/model_weights")));
    const std::map<std::string, Tensor> before = check_runs_like_whole(dir.file("plan"), planned);
    fs::remove_all(dir.file("model"));
    auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
    RunReport report = pipeline->run(pipeline->synthetic_inputs(), RunOptions{});
    for (const auto& [name, t] : before) {
      const Tensor& now = report.outputs.at(name);
      REQUIRE(now.bytes() == t.bytes());
      CHECK(std::memcmp(now.data, t.data, static_cast<size_t>(t.bytes())) == 0);
    }
    // A truncated weights file of the plan's own: the window is past its end.
    fs::resize_file(dir.file("plan/stage_1.weights"), 100);
    CHECK_THROWS_WITH_AS(Pipeline::load(dir.file("plan"), cpu_backend(), 1),
                         doctest::Contains("lies past the end of the file (100 bytes)"), Error);
  }
}

TEST_CASE("a model with external data trains and exports with external data") {
  testing::TempDir dir;
  fs::create_directory(dir.file("model"));
  for (const auto& entry : fs::directory_iterator(sample("gpt_tiny_external")))
    fs::copy_file(entry.path(), dir.path() / "model" / entry.path().filename());
  plan::PlanOptions o = gpt_options(dir.file("model/model.onnx"), 2);
  o.training = true;
  o.loss.kind = "cross-entropy";
  o.optimizer = OptimizerKind::kSgd;
  o.training_config.lr = 0.1;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  RunOptions run;
  run.steps = 2;
  pipeline->run(pipeline->synthetic_inputs(), run);
  REQUIRE(export_model(*pipeline, dir.file("trained.onnx")) > 0);
  REQUIRE(fs::exists(dir.file("trained.onnx.data")));
  CHECK(fs::file_size(dir.file("trained.onnx")) < fs::file_size(dir.file("trained.onnx.data")));
  // Every initializer in the data file holds the trained values (or the model's own, where the
  // plan did not train it); nothing is left pointing at the model's data file.
  const std::string data = testing::read_bytes(dir.file("trained.onnx.data"));
  int trained = 0, external = 0;
  const onnx::ModelProto exported = read_model(dir.file("trained.onnx"));
  for (const onnx::TensorProto& t : exported.graph().initializer()) {
    if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
    CAPTURE(t.name());
    ++external;
    CHECK(location_of(t) == "trained.onnx.data");
    int64_t offset = 0, length = 0;
    for (const auto& e : t.external_data()) {
      if (e.key() == "offset") offset = std::stoll(e.value());
      if (e.key() == "length") length = std::stoll(e.value());
    }
    CHECK(offset % 64 == 0);
    REQUIRE(offset + length <= static_cast<int64_t>(data.size()));
    for (const plan::Stage& stage : planned.plan.stages) {
      const auto& weights = pipeline->stage_weights(stage.index);
      auto it = weights.find(t.name());
      if (it == weights.end() || !pipeline->trains(stage.index, t.name())) continue;
      REQUIRE(it->second.bytes() == length);
      CHECK(std::memcmp(it->second.data, data.data() + offset, static_cast<size_t>(length)) == 0);
      ++trained;
      break;
    }
  }
  CHECK(external > 0);
  CHECK(trained > 0);
  // The export plans again, its weights read from its own data file.
  plan::PlanOptions again = gpt_options(dir.file("trained.onnx"), 2);
  plan::PlannedModel replanned = plan::make_plan(again);
  plan::write_plan(replanned, dir.file("plan2"));
  CHECK_NOTHROW(Pipeline::load(dir.file("plan2"), cpu_backend(), 1));
}

TEST_CASE("a stage file's external data must be in the plan directory or declared by plan.json") {
  testing::TempDir dir;
  testing::write_bytes(dir.file("outside.bin"), std::string(64, '\0'));
  fs::create_directory(dir.file("plan"));
  onnx::ModelProto model = testing::linear_model(4, 4);
  for (auto* info : {model.mutable_graph()->mutable_input(0), model.mutable_graph()->mutable_output(0)})
    info->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_value(2);
  onnx::shape_inference::InferShapes(model);
  onnx::TensorProto* w = nullptr;
  for (auto& t : *model.mutable_graph()->mutable_initializer())
    if (t.dims_size() == 2) w = &t;
  REQUIRE(w != nullptr);
  w->clear_raw_data();
  w->clear_float_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* e = w->add_external_data();
  e->set_key("location");
  e->set_value("../outside.bin");
  ExternalWeights external;
  external.folder = dir.file("plan");
  external.bytes = 64;
  CHECK_THROWS_WITH_AS(
      Program::from_model(model, cpu_backend(), "stage_0.onnx", std::nullopt, &external),
      doctest::Contains("external data '../outside.bin' is neither in the plan directory nor "
                        "one of plan.json's weight_files"),
      Error);
  // Without a plan, any external initializer is refused.
  CHECK_THROWS_WITH_AS(Program::from_model(model, cpu_backend(), "stage_0.onnx"),
                       doctest::Contains("keeps its data in an external file"), Error);
  // Declared, it is read; what plan.json recorded must match.
  external.declared["../outside.bin"] = dir.file("outside.bin");
  external.hash = "fnv1a64x4:0000000000000000";
  CHECK_THROWS_WITH_AS(
      Program::from_model(model, cpu_backend(), "stage_0.onnx", std::nullopt, &external),
      doctest::Contains("hash to"), Error);
  plan::WeightsHasher h;
  h.update(std::string(64, '\0').data(), 64);
  external.hash = h.digest();
  Program p = Program::from_model(model, cpu_backend(), "stage_0.onnx", std::nullopt, &external);
  CHECK(p.external_bytes() == 64);
}

TEST_CASE("the weights hash does not depend on how the bytes are fed") {
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  plan::WeightsHasher whole, pieces;
  whole.update(bytes.data(), bytes.size());
  for (size_t at = 0, step = 1; at < bytes.size(); at += step, step = step % 37 + 1)
    pieces.update(bytes.data() + at, std::min(step, bytes.size() - at));
  CHECK(whole.digest() == pieces.digest());
  CHECK(whole.bytes() == 1000);
  plan::WeightsHasher other;
  bytes[999] ^= 1;
  other.update(bytes.data(), bytes.size());
  CHECK(other.digest() != whole.digest());
}

}  // namespace
}  // namespace stagecraft::rt
