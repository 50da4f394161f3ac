// BatchNormalization in training mode (training_mode=1, as torch.onnx.export(...,
// training=TrainingMode.TRAINING) writes it at opset 14+), trained: each microbatch normalised
// by its own statistics forward and backward, and the running mean and variance updated after
// every microbatch's forward (ONNX's rule: input x momentum + batch x (1 - momentum), the
// biased variance), kept as weights that checkpoints and --export save. A small CNN built with
// the samples' builder, planned on 2 devices, trains with the losses and the running statistics
// of one device's run, under every schedule and with recomputation (whose second forward must
// not update them again).
#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "samples/builder/model_builder.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using samples::attr_float;
using samples::attr_int;
using samples::attr_ints;
using samples::ModelBuilder;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;
constexpr int64_t kChannels = 3, kSide = 6;
constexpr float kMomentum = 0.8f;  // ONNX's momentum (PyTorch's momentum=0.2)

// A BatchNorm2d exported in train mode: training_mode=1 and the two running statistics as
// outputs that nothing reads. Returns Y.
std::string batch_norm(ModelBuilder& b, const std::string& name, const std::string& x,
                       int64_t channels, bool training) {
  const std::string scale = b.add_parameter_filled(name + ".weight", {channels}, 1.0f);
  const std::string shift = b.add_parameter_filled(name + ".bias", {channels}, 0.0f);
  const std::string mean = b.add_buffer_filled(name + ".running_mean", {channels}, 0.0f);
  const std::string var = b.add_buffer_filled(name + ".running_var", {channels}, 1.0f);
  const std::string node = "/" + name + "/BatchNormalization";
  // Eval mode: Y alone (ONNX allows the statistics' outputs only in training mode).
  std::vector<std::string> outputs = {node + "_output_0"};
  if (training) outputs.insert(outputs.end(), {node + "_output_1", node + "_output_2"});
  return b.add_node("BatchNormalization", node, {x, scale, shift, mean, var}, outputs,
                    {attr_float("epsilon", 1e-5f), attr_float("momentum", kMomentum),
                     attr_int("training_mode", training ? 1 : 0)})[0];
}

std::string conv3x3(ModelBuilder& b, const std::string& name, const std::string& x, int64_t in,
                    int64_t out) {
  const std::string w = b.add_parameter(name + ".weight", {out, in, 3, 3}, in * 9);
  return b.add_op("Conv", "/" + name + "/Conv", {x, w},
                  {attr_ints("kernel_shape", {3, 3}), attr_ints("pads", {1, 1, 1, 1})});
}

// x [batch,3,6,6] -> BN (the input's own statistics) -> Conv -> BN -> Relu -> Conv -> BN -> Relu
// -> GlobalAveragePool -> Flatten -> Gemm -> y [batch,4].
void write_bn_net(const std::string& path, bool training = true) {
  ModelBuilder b("bn_train_net");
  b.add_input("x", kFloat, {"batch", kChannels, kSide, kSide});
  std::string x = batch_norm(b, "bn0", "x", kChannels, training);
  x = conv3x3(b, "conv1", x, kChannels, 8);
  x = b.add_op("Relu", "/relu1/Relu", {batch_norm(b, "bn1", x, 8, training)});
  x = conv3x3(b, "conv2", x, 8, 8);
  x = b.add_op("Relu", "/relu2/Relu", {batch_norm(b, "bn2", x, 8, training)});
  x = b.add_op("GlobalAveragePool", "/gap/GlobalAveragePool", {x});
  x = b.add_op("Flatten", "/Flatten", {x}, {attr_int("axis", 1)});
  const std::string w = b.add_parameter("fc.weight", {4, 8}, 8);
  const std::string bias = b.add_parameter("fc.bias", {4}, 8);
  b.add_node("Gemm", "/fc/Gemm", {x, w, bias}, {"y"},
             {attr_float("alpha", 1.0f), attr_float("beta", 1.0f), attr_int("transB", 1)});
  b.add_output("y", kFloat, {"batch", 4});
  b.write(path);
}

struct Model {
  testing::TempDir dir;
  std::string path = dir.file("bn_train_net.onnx");
  Model() { write_bn_net(path); }
};

const std::string& model() {
  static const Model instance;
  return instance.path;
}

plan::PlanOptions options_for(int devices, const std::string& schedule, bool recompute) {
  plan::PlanOptions o;
  o.model_path = model();
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  o.device_spec = "cpu";
  o.training = true;
  o.schedule = stagecraft::parse_schedule(schedule);
  if (schedule == "interleaved") o.chunks = 2;
  o.optimizer = stagecraft::OptimizerKind::kSgd;
  o.training_config.lr = 0.05;
  o.loss.kind = "mse";
  if (recompute) o.recompute = stagecraft::Recompute::kAll;
  return o;
}

// Channel c of the input is c + (c + 1) x uniform[-1, 1): statistics that differ per channel.
std::map<std::string, Tensor> inputs_of(const Pipeline& p) {
  std::map<std::string, Tensor> in = p.synthetic_inputs();
  Tensor& x = in.at("x");
  const int64_t plane = kSide * kSide;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t c = (i / plane) % kChannels;
    x.as<float>()[i] = static_cast<float>(c) + static_cast<float>(c + 1) * x.as<float>()[i];
  }
  return in;
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> running;  ///< Every running statistic by name.
  std::map<std::string, Tensor> inputs;
  int stages = 0;
};

std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
}

Trained train(const plan::PlanOptions& o, int steps, const std::string& plan_dir) {
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, plan_dir);
  auto p = Pipeline::load(plan_dir, cpu_backend(), 1);
  Trained out;
  out.stages = static_cast<int>(p->plan().stages.size());
  out.inputs = inputs_of(*p);
  RunOptions options;
  options.steps = steps;
  out.losses = p->run(out.inputs, options).losses;
  for (const plan::Stage& stage : p->plan().stages)
    for (const auto& [name, t] : p->stage_weights(stage.index))
      if (name.find("running_") != std::string::npos) out.running[name] = values(t);
  return out;
}

}  // namespace

TEST_CASE("BatchNormalization training_mode=1: running statistics as ONNX updates them") {
  // One step of 4 microbatches of 2: bn0 normalises the input, so its running statistics after
  // the step follow from the input alone, one update per microbatch in order.
  testing::TempDir dir;
  const Trained got = train(options_for(2, "1f1b", false), 1, dir.file("plan"));
  REQUIRE(got.stages == 2);
  const Tensor& x = got.inputs.at("x");
  const int64_t microbatches = 4, rows = x.shape[0] / microbatches, plane = kSide * kSide;
  std::vector<double> mean(kChannels, 0.0), var(kChannels, 1.0);
  for (int64_t mb = 0; mb < microbatches; ++mb)
    for (int64_t c = 0; c < kChannels; ++c) {
      double sum = 0, sq = 0;
      for (int64_t n = mb * rows; n < (mb + 1) * rows; ++n)
        for (int64_t i = 0; i < plane; ++i) sum += x.as<float>()[(n * kChannels + c) * plane + i];
      const double mu = sum / static_cast<double>(rows * plane);
      for (int64_t n = mb * rows; n < (mb + 1) * rows; ++n)
        for (int64_t i = 0; i < plane; ++i) {
          const double d = x.as<float>()[(n * kChannels + c) * plane + i] - mu;
          sq += d * d;
        }
      mean[c] = mean[c] * kMomentum + mu * (1 - kMomentum);
      var[c] = var[c] * kMomentum + sq / static_cast<double>(rows * plane) * (1 - kMomentum);
    }
  const std::vector<float>& got_mean = got.running.at("bn0.running_mean");
  const std::vector<float>& got_var = got.running.at("bn0.running_var");
  for (int64_t c = 0; c < kChannels; ++c) {
    CAPTURE(c);
    CHECK(got_mean[c] == doctest::Approx(mean[c]).epsilon(1e-5));
    CHECK(got_var[c] == doctest::Approx(var[c]).epsilon(1e-5));
  }
  // The channels' statistics differ, so the check above can tell them apart.
  CHECK(std::fabs(mean[2] - mean[0]) > 0.3);
  // Every BatchNormalization's statistics moved.
  REQUIRE(got.running.size() == 6);
  for (const auto& [name, v] : got.running) {
    CAPTURE(name);
    const float initial = name.find("mean") != std::string::npos ? 0.0f : 1.0f;
    CHECK(std::any_of(v.begin(), v.end(), [&](float f) { return std::fabs(f - initial) > 1e-3; }));
  }
}

// torch.onnx's TrainingMode.TRAINING export at opsets 9 to 13 writes BatchNormalization with
// no training_mode and five outputs (Y, running mean and var, saved mean and inverse std). The
// same net in that form trains as the opset 14 form does, to the last bit, on 1 and 2 devices;
// its stage files stay valid ONNX at its opset; a node reading the saved statistics is refused.
TEST_CASE("BatchNormalization in its pre-opset-14 training form trains as training_mode=1") {
  testing::TempDir dir;
  onnx::ModelProto m;
  REQUIRE(m.ParseFromString(testing::read_bytes(model())));
  for (auto& imp : *m.mutable_opset_import())
    if (imp.domain().empty()) imp.set_version(13);
  for (onnx::NodeProto& n : *m.mutable_graph()->mutable_node()) {
    if (n.op_type() != "BatchNormalization") continue;
    auto* attrs = n.mutable_attribute();
    attrs->erase(std::remove_if(attrs->begin(), attrs->end(),
                                [](const auto& a) { return a.name() == "training_mode"; }),
                 attrs->end());
    n.add_output(n.name() + "_saved_mean");
    n.add_output(n.name() + "_saved_var");
  }
  testing::write_model(m, dir.file("opset13.onnx"));
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    plan::PlanOptions o = options_for(devices, "1f1b", false);
    const Trained want = train(o, 3, dir.file("plan14"));
    o.model_path = dir.file("opset13.onnx");
    const Trained got = train(o, 3, dir.file("plan13"));
    CHECK(got.losses == want.losses);
    CHECK(got.running == want.running);
    plan::PlannedModel planned = plan::make_plan(o);
    for (const plan::Stage& stage : planned.plan.stages) {
      onnx::ModelProto file;
      REQUIRE(file.ParseFromString(testing::read_bytes(dir.file("plan13") + "/" + stage.file)));
      CHECK(file.opset_import(0).version() == 13);
      for (const onnx::NodeProto& n : file.graph().node())
        if (n.op_type() == "BatchNormalization") {
          CHECK(n.output_size() == 5);
          for (const auto& a : n.attribute()) CHECK(a.name() != "training_mode");
        }
      CHECK_NOTHROW(onnx::checker::check_model(dir.file("plan13") + "/" + stage.file));
    }
  }
  // A node that reads the saved mean: refused at import, naming it.
  onnx::NodeProto* reader = m.mutable_graph()->add_node();
  reader->set_op_type("Identity");
  reader->set_name("/reads_saved");
  reader->add_input(m.graph().node(0).output(3));
  reader->add_output("saved_copy");
  testing::add_tensor_info(m.mutable_graph()->add_output(), "saved_copy", kFloat, {kChannels});
  testing::write_model(m, dir.file("reads_saved.onnx"));
  plan::PlanOptions o = options_for(1, "1f1b", false);
  o.model_path = dir.file("reads_saved.onnx");
  CHECK_THROWS_WITH_AS(plan::make_plan(o), doctest::Contains("its saved mean"), Error);
}

TEST_CASE("BatchNormalization training_mode=1 trains on 2 devices as on one") {
  const int steps = 6;
  testing::TempDir dir;
  const Trained one = train(options_for(1, "1f1b", false), steps, dir.file("one"));
  REQUIRE(one.losses.size() == static_cast<size_t>(steps));
  CHECK(one.losses.back() < one.losses.front());  // it learns
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"})
    for (bool recompute : {false, true}) {
      if (recompute && std::string(schedule) == "interleaved") continue;
      CAPTURE(schedule);
      CAPTURE(recompute);
      const Trained two =
          train(options_for(2, schedule, recompute), steps,
                dir.file(std::string("two_") + schedule + (recompute ? "_rc" : "")));
      CHECK(two.stages == (std::string(schedule) == "interleaved" ? 4 : 2));
      REQUIRE(two.losses.size() == one.losses.size());
      for (size_t k = 0; k < one.losses.size(); ++k) {
        CAPTURE(k);
        CHECK(std::fabs(two.losses[k] - one.losses[k]) <=
              1e-5 * std::max(1.0, std::fabs(one.losses[k])));
      }
      // The running statistics: the same updates in the same order.
      REQUIRE(two.running.size() == one.running.size());
      for (const auto& [name, want] : one.running) {
        CAPTURE(name);
        const std::vector<float>& have = two.running.at(name);
        REQUIRE(have.size() == want.size());
        for (size_t i = 0; i < want.size(); ++i)
          CHECK(have[i] == doctest::Approx(want[i]).epsilon(1e-5));
      }
    }
}

TEST_CASE("BatchNormalization training_mode=1 in a mixed plan: X and Y bf16, the statistics "
          "float32, within bf16's precision of fp32") {
  // Opset 15's schema lets X and Y be bfloat16 while Scale, B and the running statistics stay
  // float32 (passes::sixteen_bit_operands); the CPU widens the node, CUDA runs it natively.
  const int steps = 6;
  testing::TempDir dir;
  plan::PlanOptions o = options_for(2, "1f1b", false);
  const Trained fp32 = train(o, steps, dir.file("fp32"));
  o.precision = Precision::kMixed;
  {
    const plan::PlannedModel planned = plan::make_plan(o);
    int norms = 0;
    for (const ir::Node& n : planned.model.graph.nodes()) {
      if (n.dead || n.op_type != "BatchNormalization") continue;
      ++norms;
      CHECK(planned.model.graph.value(n.inputs[0]).dtype == DType::kBFloat16);
      CHECK(planned.model.graph.value(n.inputs[3]).dtype == DType::kFloat32);
      CHECK(planned.model.graph.value(n.outputs[1]).dtype == DType::kFloat32);
    }
    CHECK(norms == 3);
  }
  const Trained mixed = train(o, steps, dir.file("mixed"));
  REQUIRE(mixed.losses.size() == fp32.losses.size());
  CHECK(mixed.losses.back() < mixed.losses.front());  // it learns
  double worst = 0;
  for (size_t k = 0; k < fp32.losses.size(); ++k) {
    CAPTURE(k);
    const double d =
        std::fabs(mixed.losses[k] - fp32.losses[k]) / std::max(1.0, std::fabs(fp32.losses[k]));
    CHECK(d <= 0.03);
    worst = std::max(worst, d);
  }
  MESSAGE("largest relative loss difference from fp32: " << worst);
  CHECK(worst > 0);  // the arithmetic is not fp32's
  REQUIRE(mixed.running.size() == fp32.running.size());
  for (const auto& [name, want] : fp32.running) {
    CAPTURE(name);
    const std::vector<float>& have = mixed.running.at(name);
    REQUIRE(have.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i)
      CHECK(std::fabs(have[i] - want[i]) <= 0.03 * std::max(1.0f, std::fabs(want[i])));
  }
}

TEST_CASE("stagec says how a trained model's BatchNormalizations train") {
  const std::string summary = plan::make_plan(options_for(2, "1f1b", false)).batch_norm_summary;
  CHECK(summary.find("3 BatchNormalization nodes in training mode") != std::string::npos);
  CHECK(summary.find("inference mode") == std::string::npos);
  // The same network exported in eval mode: its running statistics are constants.
  testing::TempDir dir;
  plan::PlanOptions o = options_for(2, "1f1b", false);
  o.model_path = dir.file("bn_eval_net.onnx");
  write_bn_net(o.model_path, false);
  const std::string eval = plan::make_plan(o).batch_norm_summary;
  CHECK(eval.find("3 BatchNormalization nodes in inference mode") != std::string::npos);
  CHECK(eval.find("the network trains without batch statistics") != std::string::npos);
  CHECK(eval.find("training mode (") == std::string::npos);
  CHECK(std::count(eval.begin(), eval.end(), '\n') == 1);  // one line
  // Not training: nothing to say.
  o.training = false;
  o.loss.kind.clear();
  o.schedule.reset();
  CHECK(plan::make_plan(o).batch_norm_summary.empty());
}

TEST_CASE("BatchNormalization running statistics: checkpoint, resume and export keep them") {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(options_for(2, "1f1b", false));
  plan::write_plan(planned, dir.file("plan"));
  auto p = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  const std::map<std::string, Tensor> inputs = inputs_of(*p);
  RunOptions options;
  options.steps = 2;
  p->run(inputs, options);
  save_checkpoint(*p, dir.file("ckpt"));
  std::map<std::string, std::vector<float>> after;
  for (const plan::Stage& stage : p->plan().stages)
    for (const auto& [name, t] : p->stage_weights(stage.index))
      if (name.find("running_") != std::string::npos) after[name] = values(t);
  REQUIRE(after.size() == 6);

  // Resumed into a fresh pipeline: the statistics come back, and 2 more steps go on from them
  // as 2 more steps of the first pipeline do.
  auto q = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  CHECK(load_checkpoint(*q, dir.file("ckpt")) == 2);
  for (const plan::Stage& stage : q->plan().stages)
    for (const auto& [name, t] : q->stage_weights(stage.index))
      if (after.count(name)) CHECK(values(t) == after.at(name));
  p->run(inputs, options);
  q->run(inputs, options);
  for (const plan::Stage& stage : q->plan().stages)
    for (const auto& [name, t] : q->stage_weights(stage.index))
      if (after.count(name)) {
        CAPTURE(name);
        CHECK(values(t) == values(p->stage_weights(stage.index).at(name)));
        CHECK(values(t) != after.at(name));
      }

  // --export: the model's running statistics are the trained ones.
  const std::string out = dir.file("trained.onnx");
  export_model(*p, out);
  onnx::ModelProto exported;
  std::ifstream in(out, std::ios::binary);
  REQUIRE(exported.ParseFromIstream(&in));
  int found = 0;
  for (const onnx::TensorProto& init : exported.graph().initializer()) {
    if (init.name().find("running_") == std::string::npos) continue;
    CAPTURE(init.name());
    const Tensor t = tensor_from_proto(init, init.name());
    for (const plan::Stage& stage : p->plan().stages)
      if (auto it = p->stage_weights(stage.index).find(init.name());
          it != p->stage_weights(stage.index).end()) {
        CHECK(values(t) == values(it->second));
        ++found;
      }
  }
  CHECK(found == 6);
}

TEST_CASE("BatchNormalization training_mode=1 in an evaluation: the running statistics normalise") {
  // Untrained, the running statistics are mean 0 and variance 1, far from the input's (channel
  // c has mean c and spread c + 1): an evaluation (forward only, model.eval()) of the
  // training-mode net is the forward of the same net exported in eval mode, not a training
  // step's forward, which normalises with each microbatch's statistics.
  testing::TempDir dir;
  plan::PlanOptions o = options_for(2, "1f1b", false);
  plan::PlannedModel train_planned = plan::make_plan(o);
  plan::write_plan(train_planned, dir.file("train_mode"));
  o.model_path = dir.file("bn_eval_net.onnx");
  write_bn_net(o.model_path, false);
  plan::PlannedModel eval_planned = plan::make_plan(o);
  plan::write_plan(eval_planned, dir.file("eval_mode"));
  auto train_mode = Pipeline::load(dir.file("train_mode"), cpu_backend(), 1);
  auto eval_mode = Pipeline::load(dir.file("eval_mode"), cpu_backend(), 1);
  const std::map<std::string, Tensor> inputs = inputs_of(*train_mode);
  RunOptions evaluation;
  evaluation.forward_only = true;
  const double evaluated = train_mode->run(inputs, evaluation).losses.at(0);
  const double exported_eval = eval_mode->run(inputs, evaluation).losses.at(0);
  CHECK(std::fabs(evaluated - exported_eval) <= 1e-6 * std::max(1.0, std::fabs(exported_eval)));
  std::map<std::string, std::vector<float>> before;
  for (const plan::Stage& stage : train_mode->plan().stages)
    for (const auto& [name, t] : train_mode->stage_weights(stage.index))
      if (name.find("running_") != std::string::npos) before[name] = values(t);
  const double trained = train_mode->run(inputs, RunOptions{}).losses.at(0);
  CHECK(std::fabs(evaluated - trained) > 1e-3 * std::max(1.0, std::fabs(trained)));
  // The evaluation wrote no statistics (the step after it started from mean 0, variance 1).
  REQUIRE(before.size() == 6);
  for (const auto& [name, v] : before) {
    CAPTURE(name);
    const float initial = name.find("mean") != std::string::npos ? 0.0f : 1.0f;
    CHECK(std::all_of(v.begin(), v.end(), [&](float f) { return f == initial; }));
  }
}

TEST_CASE("BatchNormalization with data-parallel replicas: an evaluation normalises with the "
          "first replica's running statistics, as DDP's broadcast_buffers") {
  // Two replicas train on different halves of each batch, so each writes its own running
  // statistics; the first replica's are the ones a checkpoint keeps. DDP broadcasts rank 0's
  // buffers before every forward, so its evaluation normalises every rank's share with rank 0's:
  // here share_running_statistics (which stagerun's evaluation calls) does that, and the
  // evaluation's loss is then that of one replica holding the checkpoint.
  testing::TempDir dir;
  plan::PlanOptions o = options_for(2, "1f1b", false);
  o.devices = 2;
  o.data_parallel = 2;  // 2 replicas of 1 device
  plan::PlannedModel dp_planned = plan::make_plan(o);
  plan::write_plan(dp_planned, dir.file("dp"));
  auto dp = Pipeline::load(dir.file("dp"), cpu_backend(), 1);
  REQUIRE(dp->plan().data_parallel == 2);
  const std::map<std::string, Tensor> inputs = inputs_of(*dp);
  RunOptions training;
  training.steps = 2;
  dp->run(inputs, training);
  auto running = [&](int replica) {
    std::map<std::string, std::vector<float>> out;
    for (const plan::Stage& stage : dp->plan().stages)
      for (const auto& [name, t] : dp->replica_weights(replica, stage.index))
        if (name.find("running_") != std::string::npos) out[name] = values(t);
    return out;
  };
  REQUIRE(running(0).size() == 6);
  CHECK(running(0) != running(1));  // each replica's own microbatches
  RunOptions evaluation;
  evaluation.forward_only = true;
  const double own = dp->run(inputs, evaluation).losses.at(0);
  dp->share_running_statistics();
  CHECK(running(0) == running(1));
  const double shared = dp->run(inputs, evaluation).losses.at(0);
  CHECK(std::fabs(own - shared) > 1e-6 * std::max(1.0, std::fabs(shared)));
  // One replica with the first replica's weights (the checkpoint) evaluates the same batch.
  save_checkpoint(*dp, dir.file("ckpt"));
  plan::PlanOptions one = options_for(1, "1f1b", false);
  plan::PlannedModel one_planned = plan::make_plan(one);
  plan::write_plan(one_planned, dir.file("one"));
  auto single = Pipeline::load(dir.file("one"), cpu_backend(), 1);
  REQUIRE(load_checkpoint(*single, dir.file("ckpt")) == 2);
  const double reference = single->run(inputs, evaluation).losses.at(0);
  CHECK(std::fabs(shared - reference) <= 1e-6 * std::max(1.0, std::fabs(reference)));
}

}  // namespace stagecraft::rt
