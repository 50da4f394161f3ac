// The random ops (RandomNormalLike, RandomUniformLike, RandomNormal, RandomUniform: a VAE's
// torch.randn_like, torch.rand_like): the kernels draw the distributions their attributes say,
// from the run's key and the node (runtime/ops/random_element.h); a VAE-style model trains
// pipelined with the noise of one device's run, recomputed or not, and an inference run draws
// new noise each step, the same again when run again.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
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

// Runs the CPU kernel `op` on `like` (the *Like ops) or on nothing, with attributes `attrs`
// and the run's key `key`, into a float32 (or float64) tensor of `shape`.
Tensor draw(const std::string& op, const Shape& shape, uint64_t key,
            std::vector<onnx::AttributeProto> attrs = {}, DType dtype = DType::kFloat32) {
  onnx::NodeProto node;
  node.set_op_type(op);
  for (auto& a : attrs) *node.add_attribute() = a;
  if (op.ends_with("Like")) {
    // attrs already set; the input is only a shape
  } else {
    onnx::AttributeProto s;
    s.set_name("shape");
    s.set_type(onnx::AttributeProto::INTS);
    for (int64_t d : shape) s.add_ints(d);
    *node.add_attribute() = s;
  }
  const Attrs a(node);
  Tensor like = Tensor::owned(DType::kInt64, shape);  // values never read
  Tensor out = Tensor::owned(dtype, shape);
  std::vector<const Tensor*> in;
  if (op.ends_with("Like")) in.push_back(&like);
  std::vector<Tensor*> outs = {&out};
  const KernelEntry* entry = &cpu_backend().entry(op);
  REQUIRE(
      entry
          ->check(OpSignature{
              op, op.ends_with("Like") ? std::vector<DType>{DType::kInt64} : std::vector<DType>{},
              std::vector<DType>{dtype}, a})
          .empty());
  auto device = cpu_backend().make_device(0, 1);
  KernelArgs args{"noise", op, a, in, outs, *device, key};
  entry->run(args);
  return out;
}

double value(const Tensor& t, int64_t i) {
  return t.dtype == DType::kFloat64 ? t.as<double>()[i] : t.as<float>()[i];
}

struct Moments {
  double mean = 0, sd = 0, lo = INFINITY, hi = -INFINITY;
};

Moments moments(const Tensor& t) {
  Moments m;
  const auto n = static_cast<double>(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    m.mean += value(t, i) / n;
    m.lo = std::min(m.lo, value(t, i));
    m.hi = std::max(m.hi, value(t, i));
  }
  for (int64_t i = 0; i < t.numel(); ++i) m.sd += std::pow(value(t, i) - m.mean, 2) / n;
  m.sd = std::sqrt(m.sd);
  return m;
}

bool same(const Tensor& a, const Tensor& b) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (value(a, i) != value(b, i)) return false;
  return true;
}

}  // namespace

TEST_CASE("random ops: the distributions their attributes say, from the run's key and seed") {
  const Shape shape{200, 500};  // 1e5 draws: the mean within 4 / sqrt(n) of the true one
  const double tol = 4 / std::sqrt(1e5);
  const Moments normal = moments(draw("RandomNormalLike", shape, 11));
  CHECK(std::fabs(normal.mean) < tol);
  CHECK(std::fabs(normal.sd - 1) < 0.02);
  CHECK(normal.lo < -3.5);
  CHECK(normal.hi > 3.5);
  const Moments shifted = moments(
      draw("RandomNormal", shape, 11, {attr_float("mean", 2.0f), attr_float("scale", 0.5f)}));
  CHECK(std::fabs(shifted.mean - 2) < 0.5 * tol);
  CHECK(std::fabs(shifted.sd - 0.5) < 0.01);
  const Moments uniform = moments(
      draw("RandomUniformLike", shape, 11, {attr_float("low", -1.0f), attr_float("high", 3.0f)}));
  CHECK(uniform.lo >= -1.0);
  CHECK(uniform.hi < 3.0);
  CHECK(std::fabs(uniform.mean - 1) < 4 * tol * 4 / std::sqrt(12.0));
  CHECK(std::fabs(uniform.sd - 4 / std::sqrt(12.0)) < 0.02);
  const Moments unit = moments(draw("RandomUniform", shape, 11, {}, DType::kFloat64));
  CHECK(unit.lo >= 0.0);
  CHECK(unit.hi < 1.0);
  CHECK(std::fabs(unit.mean - 0.5) < tol);

  // The same key and seed draw the same numbers; another key, or another seed, others.
  const Tensor a = draw("RandomNormalLike", {64}, 11);
  CHECK(same(a, draw("RandomNormalLike", {64}, 11)));
  CHECK_FALSE(same(a, draw("RandomNormalLike", {64}, 12)));
  CHECK_FALSE(same(a, draw("RandomNormalLike", {64}, 11, {attr_float("seed", 3.0f)})));
  // A 16-bit output is refused with a reason (the check both backends answer with).
  onnx::NodeProto node;
  const Attrs none(node);
  const DType f16[] = {DType::kFloat16};
  const DType i64[] = {DType::kInt64};
  CHECK(cpu_backend()
            .entry("RandomNormalLike")
            .check(OpSignature{"RandomNormalLike", i64, f16, none})
            .find("float32 and float64 only") != std::string::npos);
}

TEST_CASE("random ops: a VAE trains pipelined on the noise of one device's run") {
  testing::TempDir dir;
  const std::string vae = dir.file("vae.onnx"), quiet = dir.file("vae_quiet.onnx");
  testing::write_vae(vae, 1.0f);
  testing::write_vae(quiet, 0.0f);
  const int steps = 6;
  const std::vector<double> one = testing::train_losses(
      testing::training_options(vae, 1, "1f1b", "mse"), steps, dir.file("one"));
  REQUIRE(one.size() == static_cast<size_t>(steps));
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"})
    for (bool recompute : {false, true}) {
      CAPTURE(schedule);
      CAPTURE(recompute);
      plan::PlanOptions o = testing::training_options(vae, 2, schedule, "mse");
      if (recompute) o.recompute = stagecraft::Recompute::kAll;
      CHECK(testing::losses_close(
          testing::train_losses(o, steps,
                                dir.file(std::string("two_") + schedule + (recompute ? "rc" : ""))),
          one));
    }
  // The noise is in effect: the model with scale 0 has other losses.
  const std::vector<double> noiseless = testing::train_losses(
      testing::training_options(quiet, 1, "1f1b", "mse"), steps, dir.file("quiet"));
  CHECK(std::fabs(noiseless[0] - one[0]) > 1e-4 * std::fabs(one[0]));
}

TEST_CASE("random ops: an inference run draws new noise each step, the same when run again") {
  testing::TempDir dir;
  const std::string vae = dir.file("vae.onnx");
  testing::write_vae(vae, 1.0f);
  plan::PlanOptions o = testing::inference_options(vae, 2);
  o.microbatches = 2;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("plan"));
  auto outputs = [&](int steps) {
    auto p = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
    RunOptions options;
    options.steps = steps;
    return p->run(p->synthetic_inputs(), options).outputs.at("y");
  };
  const Tensor first = outputs(1), again = outputs(1), second = outputs(2);
  CHECK(same(first, again));
  CHECK_FALSE(same(first, second));
  // The two microbatches (the same synthetic rows? no: their own) draw their own noise: the
  // batch's halves differ wherever their inputs agree or not.
  const int64_t half = first.numel() / 2;
  bool halves_differ = false;
  for (int64_t i = 0; i < half; ++i)
    halves_differ |= first.as<float>()[i] != first.as<float>()[half + i];
  CHECK(halves_differ);
}

}  // namespace stagecraft::rt
