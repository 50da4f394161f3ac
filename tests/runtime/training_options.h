#pragma once
/// \file
/// What the pipelined training tests start from: their plan options, and a plan trained on
/// synthetic inputs.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/vocabulary.h"
#include "samples/builder/model_builder.h"
#include "samples/builder/sample_models.h"

namespace stagecraft::testing {

/// Plans `model` (a path) for inference on `devices` with the cpu device spec: batch 8 in 4
/// microbatches.
inline plan::PlanOptions inference_options(const std::string& model, int devices) {
  plan::PlanOptions o;
  o.model_path = model;
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  o.device_spec = "cpu";
  return o;
}

/// Whether two runs' losses agree step by step within `rtol` (relative to max(1, |b|)).
inline bool losses_close(const std::vector<double>& a, const std::vector<double>& b,
                         double rtol = 1e-5) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!(std::fabs(a[k] - b[k]) <= rtol * std::max(1.0, std::fabs(b[k])))) return false;
  return true;
}

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

/// An embedding LM whose table has a row of zeros, as nn.Embedding(padding_idx=0) leaves it:
/// ids int64 [batch, 6] -> Gather(emb.weight [10, 4], row 0 zeros) -> MatMul(head.weight [4, 5])
/// -> logits [batch, 6, 5], written to `path`. Returns the table's values.
inline std::vector<float> write_padded_embedding_lm(const std::string& path) {
  samples::ModelBuilder b("embedding_lm");
  b.add_input("ids", onnx::TensorProto::INT64, {"batch", 6});
  std::vector<float> table(10 * 4);
  for (size_t k = 4; k < table.size(); ++k) table[k] = 0.1f * static_cast<float>(k % 7) - 0.3f;
  const std::string emb = b.add_float_buffer("emb.weight", {10, 4}, table);
  const std::string h = b.add_op("Gather", "/emb/Gather", {emb, "ids"});
  b.add_node("MatMul", "/head/MatMul", {h, b.add_parameter("head.weight", {4, 5}, 4)}, {"logits"});
  b.add_output("logits", onnx::TensorProto::FLOAT, {"batch", 6, 5});
  b.write(path);
  return table;
}

/// Its training plan: batch 8 in 2 microbatches, Adam at `lr`, cross-entropy, the cpu spec.
inline plan::PlanOptions padded_embedding_options(const std::string& path, int devices, double lr) {
  plan::PlanOptions o = inference_options(path, devices);
  o.microbatches = 2;
  o.training = true;
  o.optimizer = OptimizerKind::kAdam;
  o.training_config.lr = lr;
  o.loss.kind = "cross-entropy";
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

/// x [batch, 16] -> fc_mu, fc_logvar [batch, 8]; std = Exp(0.5 logvar); eps =
/// RandomNormalLike(std) (scale `noise`); z = mu + eps * std -> fc_dec -> y [batch, 4]: a VAE's
/// reparameterisation as torch.onnx writes torch.randn_like.
inline void write_vae(const std::string& path, float noise) {
  samples::ModelBuilder b("vae");
  b.add_input("x", onnx::TensorProto::FLOAT, {"batch", 16});
  auto linear = [&](const std::string& name, const std::string& x, int64_t in, int64_t out) {
    const std::string w = b.add_parameter(name + ".weight", {out, in}, in);
    const std::string bias = b.add_parameter(name + ".bias", {out}, in);
    return b.add_op("Gemm", "/" + name + "/Gemm", {x, w, bias},
                    {samples::attr_float("alpha", 1.0f), samples::attr_float("beta", 1.0f),
                     samples::attr_int("transB", 1)});
  };
  const std::string mu = linear("fc_mu", "x", 16, 8);
  const std::string logvar = linear("fc_logvar", "x", 16, 8);
  const std::string half = b.add_constant("/half", samples::make_float_tensor({}, {0.5f}));
  const std::string sd = b.add_op("Exp", "/Exp", {b.add_op("Mul", "/Mul", {logvar, half})});
  const std::string eps =
      b.add_op("RandomNormalLike", "/RandomNormalLike", {sd},
               {samples::attr_float("mean", 0.0f), samples::attr_float("scale", noise)});
  const std::string z = b.add_op("Add", "/Add", {mu, b.add_op("Mul", "/Mul_1", {eps, sd})});
  const std::string h = b.add_op("Relu", "/Relu", {linear("fc_h", z, 8, 16)});
  const std::string w = b.add_parameter("fc_out.weight", {4, 16}, 16);
  const std::string bias = b.add_parameter("fc_out.bias", {4}, 16);
  b.add_node("Gemm", "/fc_out/Gemm", {h, w, bias}, {"y"},
             {samples::attr_float("alpha", 1.0f), samples::attr_float("beta", 1.0f),
              samples::attr_int("transB", 1)});
  b.add_output("y", onnx::TensorProto::FLOAT, {"batch", 4});
  b.write(path);
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
