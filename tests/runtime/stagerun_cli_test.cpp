// stagerun as a user meets it: files in, files out, one-line errors with a non-zero exit, a
// Chrome trace and JSON figures, and a failing worker that ends the run instead of hanging it.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;

using Result = testing::CommandResult;

// Runs stagerun with `args` (a shell-quoted string); captures stdout, stderr and the exit code.
Result stagerun(const testing::TempDir& dir, const std::string& args) {
  return testing::run_captured(dir, fmt::format("{} {}", STAGECRAFT_STAGERUN, args));
}

// An error as the tools promise it: non-zero exit, exactly one line on stderr, matching `regex`.
void check_one_line_error(const Result& r, const std::string& regex) {
  CAPTURE(r.err);
  CHECK(r.code != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(std::regex_search(r.err, std::regex(regex)));
}

// toy.onnx on `devices`: batch 8 in 4 microbatches, for stagec's default device spec.
plan::PlanOptions toy_options(int devices) {
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/toy.onnx";
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  return o;
}

std::string toy_plan(const testing::TempDir& dir, int devices) {
  plan::PlanOptions o = toy_options(devices);
  o.device_spec = "cpu";
  plan::PlannedModel planned = plan::make_plan(o);
  std::string path = dir.file(fmt::format("toy{}", devices));
  plan::write_plan(planned, path);
  return path;
}

// The summary record of `stagerun --json` output: its last line (JSON Lines: one record per
// step, then the summary).
nlohmann::json json_summary(const std::string& out) {
  std::string last;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) last = line;
  nlohmann::json summary = nlohmann::json::parse(last);
  CHECK(summary["type"] == "summary");
  return summary;
}

// The loss of every step from `stagerun --json` output (JSON Lines, then the summary).
std::vector<double> json_losses(const std::string& out) {
  std::vector<double> losses;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) break;
    if (j.is_object() && j.contains("loss")) losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

// A 2-device training plan's options for toy.onnx: batch 8 in 2 microbatches, MSE loss.
plan::PlanOptions toy_training_options(const std::string& optimizer) {
  plan::PlanOptions o = toy_options(2);
  o.microbatches = 2;
  o.training = true;
  o.optimizer = stagecraft::parse_optimizer(optimizer);
  o.loss.kind = "mse";
  o.device_spec = "cpu";
  return o;
}

TEST_CASE("stagerun reads .npy inputs and writes the outputs the in-process run gives") {
  testing::TempDir dir;
  std::string plan_dir = toy_plan(dir, 2);
  auto pipeline = Pipeline::load(plan_dir, cpu_backend(), 1);
  auto inputs = pipeline->synthetic_inputs();
  write_npy(dir.file("x.npy"), inputs.at("x"));
  RunReport want = pipeline->run(inputs, RunOptions{});

  Result r = stagerun(dir, fmt::format("{} --inputs {} --outputs {} --steps 3", plan_dir,
                                       dir.file("x.npy"), dir.file("out")));
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("bubble") != std::string::npos);
  Tensor y = read_npy(dir.file("out/y.npy"));
  const Tensor& expected = want.outputs.at("y");
  REQUIRE(y.shape == expected.shape);
  CHECK(std::equal(y.as<float>(), y.as<float>() + y.numel(), expected.as<float>()));

  // The same through a directory of NAME.npy files.
  fs::create_directories(dir.file("in"));
  write_npy(dir.file("in/x.npy"), inputs.at("x"));
  CHECK(stagerun(dir, fmt::format("{} --inputs {} -q", plan_dir, dir.file("in"))).code == 0);
}

TEST_CASE("stagerun --json and --trace describe the run") {
  testing::TempDir dir;
  std::string plan_dir = toy_plan(dir, 2);
  Result r = stagerun(
      dir, fmt::format("{} --steps 4 --json --trace {}", plan_dir, dir.file("trace.json")));
  REQUIRE(r.code == 0);
  auto j = json_summary(r.out);
  CHECK(j["steps"] == 4);
  CHECK(j["step_ms"].size() == 4);
  CHECK(j["device"].size() == 2);
  CHECK(j["samples_per_s"].get<double>() > 0);
  for (const auto& d : j["device"]) CHECK(d["peak_bytes"].get<int64_t>() > 0);
  auto trace = nlohmann::json::parse(testing::read_bytes(dir.file("trace.json")));
  // Metadata, then one complete event per forward: 2 devices x 4 microbatches x 4 steps, and
  // one per step on each device ("step N").
  int complete = 0, steps = 0;
  for (const auto& e : trace["traceEvents"]) {
    complete += e["ph"] == "X" && e["cat"] == "forward";
    steps += e["ph"] == "X" && e["cat"] == "step";
  }
  CHECK(complete == 2 * 4 * 4);
  CHECK(steps == 2 * 4);
  // Both on stdout would interleave two documents: refused.
  check_one_line_error(stagerun(dir, plan_dir + " --json --trace -"),
                       "^stagerun: usage error: --json and --trace - both write to stdout; give "
                       "--trace a FILE\n$");
}

TEST_CASE("a plan costed for another kind of device is run with one warning naming the fix") {
  testing::TempDir dir;
  // stagec's default device spec: an H100. A model with some compute, so that this CPU's step
  // is far from an H100's (the toy's is within 1.5x of its launch overheads on a fast core).
  plan::PlanOptions o = toy_options(2);
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("h100"));
  Result r = stagerun(dir, dir.file("h100") + " --backend cpu --steps 2 -q");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.starts_with(
      "stagerun: warning: the plan was costed for h100 (a gpu device) but runs on the cpu "
      "backend: its predicted step, bubble and times are h100's, not this machine's; re-plan "
      "with stagec --profile cpu (measured kernel times) or --device-spec cpu (roofline)\n"));
  Result json = stagerun(dir, dir.file("h100") + " --backend cpu --steps 2 -q --json");
  REQUIRE(json.code == 0);
  auto summary = json_summary(json.out);
  REQUIRE(summary["warnings"].size() == 1);
  CHECK(r.err == "stagerun: warning: " + summary["warnings"][0].get<std::string>() + "\n");
  CHECK(summary["plan_device"]["name"] == "h100");
  // An H100's step measured on this CPU is far from the prediction: the summary says how far
  // and names the cause it can see.
  REQUIRE(summary.contains("prediction_gap"));
  const std::string gap = summary["prediction_gap"];
  CAPTURE(gap);
  CHECK(std::regex_search(gap, std::regex(R"(^measured step [0-9.]+ ms is [0-9.]+x the predicted [0-9.]+ ms; likely: .*the plan was costed for another device \(warning above\))")));
  Result text = stagerun(dir, dir.file("h100") + " --backend cpu --steps 2");
  CHECK(text.out.find("prediction: measured step ") != std::string::npos);
  // A plan costed for the CPU runs on it without a word.
  Result quiet = stagerun(dir, toy_plan(dir, 2) + " --backend cpu --steps 2 -q");
  REQUIRE(quiet.code == 0);
  CHECK(quiet.err.empty());
}

TEST_CASE("a mixed-precision plan runs in bf16 with no warning") {
  testing::TempDir dir;
  plan::PlanOptions o = toy_options(2);
  o.device_spec = "cpu";
  o.training = true;
  o.loss.kind = "mse";
  o.precision = Precision::kMixed;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("mixed"));
  Result r = stagerun(dir, dir.file("mixed") + " --backend cpu --steps 2 -q --json");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  // Its stage files compute in bfloat16 (passes/mixed_precision.cpp), as the plan predicts.
  CHECK(r.err.empty());
  auto summary = json_summary(r.out);
  CHECK(summary["warnings"].empty());
}

TEST_CASE("an fp16 plan reports its loss scale per step and refuses bad --loss-scale values") {
  testing::TempDir dir;
  plan::PlanOptions o = toy_training_options("adam");
  o.precision = Precision::kFp16;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("fp16"));
  const std::string plan_dir = dir.file("fp16");
  Result r =
      stagerun(dir, plan_dir + " --steps 3 -q --json --loss-scale 1e30 --loss-scale-window 4");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  std::vector<double> scales;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] != "step") continue;
    scales.push_back(j["loss_scale"].get<double>());
    CHECK(j["skipped"] == true);  // 1e30 overflows float16 (65504 at most) every time
  }
  CHECK(scales == std::vector<double>{1e30, 5e29, 2.5e29});
  auto summary = json_summary(r.out);
  CHECK(summary["loss_scale"]["scale"] == 1.25e29);
  CHECK(summary["loss_scale"]["skipped_steps"] == 3);
  Result text = stagerun(dir, plan_dir + " --steps 2 -q --loss-scale 1e30");
  CHECK(text.out.find("loss scale 1e+30  skipped (inf/NaN gradient)") != std::string::npos);
  CHECK(text.out.find("dynamic loss scaling: 2 of 2 steps skipped, scale now 2.5e+29") !=
        std::string::npos);
  for (const char* bad : {"0", "-1", "nan", "inf"})
    check_one_line_error(stagerun(dir, fmt::format("{} --loss-scale {}", plan_dir, bad)),
                         "^stagerun: usage error: --loss-scale");
  check_one_line_error(stagerun(dir, plan_dir + " --loss-scale-window 0"),
                       "^stagerun: usage error: --loss-scale-window must be at least 1");
  // A plan that does not scale its loss: the flag would be ignored.
  o.precision = Precision::kMixed;
  planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("mixed"));
  check_one_line_error(stagerun(dir, dir.file("mixed") + " --loss-scale 8"),
                       "--loss-scale: .* is a training plan of precision mixed; dynamic loss "
                       "scaling is for training plans of precision fp16");
}

TEST_CASE("the reported step is the median of the steps after the warm-up step") {
  testing::TempDir dir;
  std::string plan_dir = toy_plan(dir, 2);
  Result r = stagerun(dir, plan_dir + " --steps 4 -q --json");
  REQUIRE(r.code == 0);
  auto j = json_summary(r.out);
  std::vector<double> steps = j["step_ms"].get<std::vector<double>>();
  REQUIRE(steps.size() == 4);
  CHECK(j["warmup_step_ms"] == steps[0]);
  CHECK(j["median_of_steps"] == 3);
  CHECK(j["median_excludes_warmup"] == true);
  std::vector<double> steady(steps.begin() + 1, steps.end());
  std::sort(steady.begin(), steady.end());
  CHECK(j["median_step_ms"] == steady[1]);
  // The same choice in process, on times where the warm-up would be the median of all four.
  CHECK(median_step({9.0, 1.0, 3.0, 20.0}) == 2);
  CHECK(median_step({9.0, 1.0, 3.0}) == 1);  // the lower middle of an even count
  CHECK(median_step({9.0}) == 0);
  Result text = stagerun(dir, plan_dir + " --steps 4 -q");
  CHECK(text.out.find("(median of the 3 steps after the warm-up step, which took ") !=
        std::string::npos);
  Result one = stagerun(dir, plan_dir + " --steps 1 -q");
  CHECK(one.out.find("(one step, the warm-up step, slower than a steady one: --steps 3 or more "
                     "for a median without it)") != std::string::npos);
}

TEST_CASE("stagerun refuses bad input with one line and a non-zero exit") {
  testing::TempDir dir;
  std::string plan_dir = toy_plan(dir, 2);
  Tensor wrong = Tensor::owned(DType::kFloat64, {8, 10});
  write_npy(dir.file("wrong.npy"), wrong);
  check_one_line_error(
      stagerun(dir, fmt::format("{} --inputs {}", plan_dir, dir.file("wrong.npy"))),
      R"(^stagerun: shape error: input 'x' is float64\[8, 10\] but the plan takes float32\[8, 10\])");
  Tensor short_batch = Tensor::owned(DType::kFloat32, {6, 10});
  write_npy(dir.file("short.npy"), short_batch);
  check_one_line_error(
      stagerun(dir, fmt::format("{} --inputs {}", plan_dir, dir.file("short.npy"))),
      R"(input 'x' is float32\[6, 10\] but the plan takes float32\[8, 10\] \(the batch of 4 microbatches\))");
  testing::write_bytes(dir.file("junk.npy"), "junk");
  check_one_line_error(stagerun(dir, fmt::format("{} --inputs {}", plan_dir, dir.file("junk.npy"))),
                       R"(junk.npy: not a .npy file)");
  check_one_line_error(stagerun(dir, dir.file("nowhere")),
                       R"(^stagerun: i/o error: .*nowhere: no such plan directory)");
  check_one_line_error(stagerun(dir, fmt::format("{} --steps 0", plan_dir)),
                       R"(^stagerun: usage error: --steps)");
  check_one_line_error(stagerun(dir, fmt::format("{} --backend tpu", plan_dir)),
                       R"(unknown backend 'tpu')");

  // A stage file changed after compiling: its hash no longer matches.
  std::ofstream(plan_dir + "/stage_0.onnx", std::ios::app) << "tampered";
  check_one_line_error(stagerun(dir, plan_dir), R"(stage_0.onnx)");
}

TEST_CASE(
    "a training plan runs and prints the loss of every step: without a loss stagec refuses it") {
  testing::TempDir dir;
  plan::PlanOptions o = toy_training_options("sgd");
  o.loss.kind = "";
  plan::PlannedModel no_loss = plan::make_plan(o);
  // A writer killed mid-write left its staging folder (pid 999999999 is past any pid_max).
  std::filesystem::create_directory(dir.file("train.partial-999999999"));
  CHECK_THROWS_WITH_AS(plan::write_plan(no_loss, dir.file("train")),
                       doctest::Contains("needs a loss"), Error);
  // A refused plan leaves nothing behind: no partial folder, no target.
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    CHECK_MESSAGE(entry.path().filename().string().find("train") == std::string::npos, entry.path().string());
  o.loss.kind = "mse";
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("train"));
  Result r = stagerun(dir, dir.file("train") + " --steps 3 --json");
  REQUIRE(r.code == 0);
  std::vector<double> losses = json_losses(r.out);
  REQUIRE(losses.size() == 3);
  CHECK(losses[2] < losses[0]);
}

TEST_CASE("a diverging run stops naming one step number, counted from 1 as the loss lines count") {
  testing::TempDir dir;
  plan::PlanOptions o = toy_training_options("sgd");
  o.training_config.lr = 1e19;  // the loss overflows within a few steps
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("train"));
  Result r = stagerun(dir, dir.file("train") + " --steps 20");
  CAPTURE(r.out);
  check_one_line_error(r, R"(: step ([1-9][0-9]*): FWD stage [0-9]+ mb [0-9]+: .*the loss is \S+ at step \1, microbatch)");
}

TEST_CASE("a worker that fails ends the run with its error instead of a hang") {
  testing::TempDir dir;
  std::string plan_dir = toy_plan(dir, 3);
  auto pipeline = Pipeline::load(plan_dir, cpu_backend(), 1);
  std::string node = pipeline->plan().stages[1].nodes.front();
  check_one_line_error(
      stagerun(dir, fmt::format("{} --steps 5 --inject-fault '{}'", plan_dir, node)),
      fmt::format(
          R"(^stagerun: internal error: device 1: step 1: FWD stage 1 mb 0: .*fault injected at node)"));
}

}  // namespace
}  // namespace stagecraft::rt

namespace stagecraft::rt {
namespace {

TEST_CASE("stagec refuses to write a plan with an op the backend cannot run") {
  testing::TempDir dir;
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto* g = model.mutable_graph();
  g->set_name("int_matmul");
  testing::add_tensor_info(g->add_input(), "a", onnx::TensorProto::INT64, {2, 3});
  testing::add_tensor_info(g->add_input(), "b", onnx::TensorProto::INT64, {3, 2});
  testing::add_tensor_info(g->add_output(), "c", onnx::TensorProto::INT64, {2, 2});
  testing::add_node(g, "MatMul", {"a", "b"}, {"c"}, "int_product");
  testing::write_model(model, dir.file("m.onnx"));
  const Result r = testing::run_captured(
      dir, fmt::format("{} {} -o {}", STAGECRAFT_STAGEC, dir.file("m.onnx"), dir.file("plan")));
  check_one_line_error(
      r,
      R"(^stagec: unsupported error: node 'int_product' \(MatMul\): MatMul on int64 .*\(cpu backend\))");
  CHECK_FALSE(fs::exists(dir.file("plan")));
}

}  // namespace
}  // namespace stagecraft::rt

namespace stagecraft::rt {
namespace {

TEST_CASE(
    "stagerun --checkpoint then --resume continues the loss curve bit for bit: --export writes the "
    "model") {
  testing::TempDir dir;
  plan::PlanOptions o = toy_training_options("adam");
  plan::PlannedModel planned = plan::make_plan(o);
  std::string plan_dir = dir.file("train");
  plan::write_plan(planned, plan_dir);

  Result straight = stagerun(dir, plan_dir + " --steps 4 --json -q");
  REQUIRE(straight.code == 0);
  Result first = stagerun(
      dir, fmt::format("{} --steps 2 --json -q --checkpoint {}", plan_dir, dir.file("ck")));
  REQUIRE(first.code == 0);
  Result second = stagerun(dir, fmt::format("{} --steps 2 --json -q --resume {} --export {}",
                                            plan_dir, dir.file("ck"), dir.file("trained.onnx")));
  CAPTURE(second.err);
  REQUIRE(second.code == 0);
  std::vector<double> all = json_losses(first.out), rest = json_losses(second.out);
  all.insert(all.end(), rest.begin(), rest.end());
  CHECK(all == json_losses(straight.out));  // bit for bit
  CHECK(fs::file_size(dir.file("trained.onnx")) > 0);

  // A plan of other cuts resumes it and exports the same model (--steps 0: the checkpoint's
  // weights).
  o.devices = 3;
  plan::PlannedModel other_plan = plan::make_plan(o);
  plan::write_plan(other_plan, dir.file("other"));
  Result other = stagerun(dir, fmt::format("{} --steps 0 -q --resume {} --export {}",
                                           dir.file("other"), dir.file("ck"),
                                           dir.file("other.onnx")));
  CAPTURE(other.err);
  REQUIRE(other.code == 0);
  Result same = stagerun(dir, fmt::format("{} --steps 0 -q --resume {} --export {}", plan_dir,
                                          dir.file("ck"), dir.file("same.onnx")));
  REQUIRE(same.code == 0);
  CHECK(testing::read_bytes(dir.file("other.onnx")) == testing::read_bytes(dir.file("same.onnx")));
  // A checkpoint of another optimizer is refused in one line.
  plan::PlannedModel sgd = plan::make_plan(toy_training_options("sgd"));
  plan::write_plan(sgd, dir.file("sgd"));
  check_one_line_error(stagerun(dir, fmt::format("{} --resume {}", dir.file("sgd"), dir.file("ck"))),
                       "written for another plan: optimizer adam, this plan has sgd");
}

}  // namespace
}  // namespace stagecraft::rt

namespace stagecraft::rt {
namespace {

TEST_CASE(
    "stagerun --data trains on K batches in order: a file that is not whole batches is refused") {
  testing::TempDir dir;
  plan::PlanOptions o = toy_training_options("sgd");
  plan::PlannedModel planned = plan::make_plan(o);
  std::string plan_dir = dir.file("train");
  plan::write_plan(planned, plan_dir);
  auto pipeline = Pipeline::load(plan_dir, cpu_backend(), 1);
  std::map<std::string, Tensor> one = pipeline->synthetic_inputs();

  // One batch in --data is the same as --inputs of that batch, step for step.
  fs::create_directories(dir.file("one"));
  for (const auto& [name, t] : one) write_npy(dir.file("one/" + name + ".npy"), t);
  Result with_inputs =
      stagerun(dir, fmt::format("{} --steps 3 --json -q --inputs {}", plan_dir, dir.file("one")));
  Result with_data =
      stagerun(dir, fmt::format("{} --steps 3 --json -q --data {}", plan_dir, dir.file("one")));
  REQUIRE(with_inputs.code == 0);
  REQUIRE(with_data.code == 0);
  CHECK(json_losses(with_data.out) == json_losses(with_inputs.out));

  // Two batches: the second differs (x doubled), so step 2's loss differs from the one-batch run.
  fs::create_directories(dir.file("two"));
  for (const auto& [name, t] : one) {
    Tensor second = clone(t);
    if (name == "x")
      for (int64_t i = 0; i < second.numel(); ++i) second.as<float>()[i] *= 2;
    write_npy(dir.file("two/" + name + ".npy"), concat_rows({t, second}));
  }
  Result two =
      stagerun(dir, fmt::format("{} --steps 3 --json -q --data {}", plan_dir, dir.file("two")));
  REQUIRE(two.code == 0);
  std::vector<double> l2 = json_losses(two.out), l1 = json_losses(with_inputs.out);
  REQUIRE(l2.size() == 3);
  CHECK(l2[0] == l1[0]);
  CHECK(l2[1] != l1[1]);

  // 12 rows is not a whole number of batches of 8.
  fs::create_directories(dir.file("bad"));
  for (const auto& [name, t] : one)
    write_npy(dir.file("bad/" + name + ".npy"), concat_rows({t, slice_rows(t, 0, 4)}));
  check_one_line_error(
      stagerun(dir, fmt::format("{} --data {}", plan_dir, dir.file("bad"))),
      R"(--data .*: input '.*' is float32\[12, .*\] but should be K batches of float32\[8, )");
}

}  // namespace
}  // namespace stagecraft::rt

namespace stagecraft::rt {
namespace {

TEST_CASE("--data of another sequence length says which --dim to re-plan with: a missing file names --data") {
  testing::TempDir dir;
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  o.devices = 2;
  o.batch = 8;
  o.microbatches = 4;
  o.dims["seq"] = 32;
  o.training = true;
  o.loss.kind = "cross-entropy";
  o.device_spec = "cpu";
  plan::PlannedModel planned = plan::make_plan(o);
  const std::string plan_dir = dir.file("plan");
  plan::write_plan(planned, plan_dir);
  // Two batches of sequences of 64 tokens for a plan made for 32.
  fs::create_directories(dir.file("data"));
  for (const char* name : {"input_ids", "labels"})
    write_npy(dir.file(std::string("data/") + name + ".npy"), Tensor::owned(DType::kInt64, {16, 64}));
  check_one_line_error(
      stagerun(dir, fmt::format("{} --steps 1 --data {}", plan_dir, dir.file("data"))),
      R"(--data .*: input 'input_ids' is int64\[16, 64\] but should be K batches of int64\[8, 32\] along the first axis; the plan fixed seq=32: re-plan for this data with stagec's --dim seq=64\n)");
  fs::remove(dir.file("data/labels.npy"));
  write_npy(dir.file("data/input_ids.npy"), Tensor::owned(DType::kInt64, {16, 32}));
  check_one_line_error(
      stagerun(dir, fmt::format("{} --steps 1 --data {}", plan_dir, dir.file("data"))),
      R"(^stagerun: usage error: --data .*data: no labels.npy or labels.pb for input 'labels' \(K batches of int64\[8, 32\]\)\n)");
}

}  // namespace
}  // namespace stagecraft::rt
