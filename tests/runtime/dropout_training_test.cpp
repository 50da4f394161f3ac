// Dropout in training mode (its training_mode input true, as torch.onnx.export(...,
// training=TrainingMode.TRAINING) writes it at opset 12+), trained: the mask derives from the
// step, the microbatch and the node (runtime/ops/dropout_mask.h), so a pipelined run draws the
// masks of one device's run, with and without recomputation, and its gradient reads the mask
// its forward drew (stagec adds the mask output where the file omits it).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "samples/builder/model_builder.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using samples::attr_float;
using samples::attr_int;
using samples::make_float_tensor;
using samples::ModelBuilder;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

// A Dropout as torch.onnx writes it: the ratio and training_mode as Constant nodes, the mask
// output present (`with_mask`) or not.
std::string dropout(ModelBuilder& b, const std::string& name, const std::string& x, float ratio,
                    bool training, bool with_mask) {
  const std::string r = b.add_constant("/" + name + "/Constant", make_float_tensor({}, {ratio}));
  onnx::TensorProto mode;
  mode.set_data_type(onnx::TensorProto::BOOL);
  mode.add_int32_data(training ? 1 : 0);
  const std::string t = b.add_constant("/" + name + "/Constant_1", mode);
  const std::string node = "/" + name + "/Dropout";
  std::vector<std::string> outputs = {node + "_output_0"};
  if (with_mask) outputs.push_back(node + "_output_1");
  return b.add_node("Dropout", node, {x, r, t}, outputs)[0];
}

std::string linear(ModelBuilder& b, const std::string& name, const std::string& x, int64_t in,
                   int64_t out) {
  const std::string w = b.add_parameter(name + ".weight", {out, in}, in);
  const std::string bias = b.add_parameter(name + ".bias", {out}, in);
  return b.add_op("Gemm", "/" + name + "/Gemm", {x, w, bias},
                  {attr_float("alpha", 1.0f), attr_float("beta", 1.0f), attr_int("transB", 1)});
}

// x [batch,16] -> Linear -> Relu -> Dropout (no mask output) -> Linear -> Relu -> Dropout (mask
// output) -> Linear -> y [batch,4].
void write_dropout_net(const std::string& path, bool training) {
  ModelBuilder b("dropout_net");
  b.add_input("x", kFloat, {"batch", 16});
  std::string x = b.add_op("Relu", "/relu1/Relu", {linear(b, "fc1", "x", 16, 32)});
  x = dropout(b, "drop1", x, 0.3f, training, false);
  x = b.add_op("Relu", "/relu2/Relu", {linear(b, "fc2", x, 32, 32)});
  x = dropout(b, "drop2", x, 0.5f, training, true);
  const std::string w = b.add_parameter("fc3.weight", {4, 32}, 32);
  const std::string bias = b.add_parameter("fc3.bias", {4}, 32);
  b.add_node("Gemm", "/fc3/Gemm", {x, w, bias}, {"y"},
             {attr_float("alpha", 1.0f), attr_float("beta", 1.0f), attr_int("transB", 1)});
  b.add_output("y", kFloat, {"batch", 4});
  b.write(path);
}

struct Models {
  testing::TempDir dir;
  std::string training = dir.file("dropout_train.onnx"), eval = dir.file("dropout_eval.onnx");
  Models() {
    write_dropout_net(training, true);
    write_dropout_net(eval, false);
  }
};

const Models& models() {
  static const Models instance;
  return instance;
}

plan::PlanOptions options_for(const std::string& model, int devices, const std::string& schedule,
                              bool recompute) {
  plan::PlanOptions o = testing::training_options(model, devices, schedule, "mse");
  if (recompute) o.recompute = stagecraft::Recompute::kAll;
  return o;
}

std::vector<double> train(const plan::PlanOptions& o, int steps, const std::string& plan_dir,
                          int* stages = nullptr) {
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, plan_dir);
  auto p = Pipeline::load(plan_dir, cpu_backend(), 1);
  if (stages) *stages = static_cast<int>(p->plan().stages.size());
  RunOptions options;
  options.steps = steps;
  return p->run(p->synthetic_inputs(), options).losses;
}

bool close(const std::vector<double>& a, const std::vector<double>& b) {
  return testing::losses_close(a, b);
}

}  // namespace

TEST_CASE("Dropout training_mode=true: the masks of one device's run on 2 devices") {
  const int steps = 8;
  testing::TempDir dir;
  const std::vector<double> one =
      train(options_for(models().training, 1, "1f1b", false), steps, dir.file("one"));
  REQUIRE(one.size() == static_cast<size_t>(steps));
  CHECK((one[steps - 1] + one[steps - 2]) / 2 < one[0]);  // it learns, through the noise
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"})
    for (bool recompute : {false, true}) {
      CAPTURE(schedule);
      CAPTURE(recompute);
      int stages = 0;
      const std::vector<double> two =
          train(options_for(models().training, 2, schedule, recompute), steps,
                dir.file(std::string("two_") + schedule + (recompute ? "_rc" : "")), &stages);
      CHECK(stages == 2);
      CHECK(close(two, one));
    }
  // The same plan run again draws the same masks: the same losses, bit for bit.
  CHECK(train(options_for(models().training, 2, "1f1b", false), steps, dir.file("again")) ==
        train(options_for(models().training, 2, "1f1b", false), steps, dir.file("again2")));
  // The masks are in effect: the model with training_mode=false (the identity) has other losses.
  const std::vector<double> eval =
      train(options_for(models().eval, 1, "1f1b", false), steps, dir.file("eval"));
  REQUIRE(eval.size() == one.size());
  CHECK(std::fabs(eval[0] - one[0]) > 1e-4 * std::fabs(eval[0]));
}

TEST_CASE("Dropout training_mode=true: stagec gives a Dropout without one its mask output") {
  plan::PlannedModel planned = plan::make_plan(options_for(models().training, 2, "1f1b", false));
  int dropouts = 0;
  for (const ir::Node& node : planned.model.graph.nodes()) {
    if (node.dead || node.op_type != "Dropout") continue;
    ++dropouts;
    REQUIRE(node.outputs.size() == 2);
    REQUIRE(node.outputs[1] != ir::kNoId);
    CHECK(planned.model.graph.value(node.outputs[1]).dtype == DType::kBool);
  }
  CHECK(dropouts == 2);
  // In inference mode, nothing to keep.
  plan::PlannedModel eval = plan::make_plan(options_for(models().eval, 2, "1f1b", false));
  for (const ir::Node& node : eval.model.graph.nodes())
    if (!node.dead && node.name == "/drop1/Dropout") CHECK(node.outputs.size() == 1);
}

TEST_CASE("Dropout training_mode=true: an evaluation (forward only) runs it as the identity") {
  testing::TempDir dir;
  // The training-mode model evaluated, pipelined, and its eval-mode twin (the same weights)
  // trained one step: the step's forward loss is the evaluation's.
  plan::PlannedModel planned = plan::make_plan(options_for(models().training, 2, "1f1b", false));
  plan::write_plan(planned, dir.file("training"));
  auto training = Pipeline::load(dir.file("training"), cpu_backend(), 1);
  RunOptions eval;
  eval.forward_only = true;
  const auto inputs = training->synthetic_inputs();
  const double evaluated = training->run(inputs, eval).losses.at(0);
  const std::vector<double> identity =
      train(options_for(models().eval, 1, "1f1b", false), 1, dir.file("eval"));
  const std::vector<double> masked =
      train(options_for(models().training, 1, "1f1b", false), 1, dir.file("masked"));
  REQUIRE(identity.size() == 1);
  CHECK(std::fabs(evaluated - identity[0]) <= 1e-6 * std::max(1.0, std::fabs(identity[0])));
  CHECK(std::fabs(masked[0] - identity[0]) > 1e-4 * std::fabs(identity[0]));  // masks in effect
  // Deterministic: evaluated again, the same bits; and no step was taken.
  CHECK(training->run(inputs, eval).losses.at(0) == evaluated);
  CHECK(training->steps_done() == 0);
}

}  // namespace stagecraft::rt
