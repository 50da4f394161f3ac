// The CUDA kernels that run 16-bit floats natively (grad_eltwise_kernels.cu's 16-bit unary
// gradients, CastGrad into a 16-bit input, LayerNormalization, BatchNormalization and their
// gradients) against the widened fallback they replace: the float32 kernel on the exactly
// widened operands, its result rounded to the 16-bit type. Both compute the same float32 formula
// on the same values, so they agree to the bit, give or take one unit in the last place where
// the compiler contracts a multiply-add differently. And LayerNormalization in float32 against
// the CPU backend, with rows reduced a warp each and a block each (norm_kernels.cu).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/format/grad_ops.h"
#include "tests/runtime/attention_util.h"

namespace stagecraft::testing {
namespace {

onnx::NodeProto node(const std::string& op, int forward_inputs,
                     const std::string& approximate = "") {
  onnx::NodeProto n;
  n.set_name(op);
  n.set_op_type(op);
  n.set_domain(std::string(grad::kGradDomain));
  onnx::AttributeProto* f = n.add_attribute();
  f->set_name(std::string(grad::kForwardInputsAttr));
  f->set_type(onnx::AttributeProto::INT);
  f->set_i(forward_inputs);
  if (!approximate.empty()) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name("approximate");
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(approximate);
  }
  return n;
}

using attention::cast;

/// Elements of two 16-bit tensors that differ by more than one unit in the last place.
int64_t beyond_one_ulp(const rt::Tensor& a, const rt::Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    uint16_t x, y;
    std::memcpy(&x, a.data + 2 * i, 2);
    std::memcpy(&y, b.data + 2 * i, 2);
    // Same sign: adjacent encodings are adjacent values; zeros of either sign are equal.
    const bool zeros = ((x | y) & 0x7fff) == 0;
    const int diff = (x >> 15) == (y >> 15) ? std::abs(int(x) - int(y)) : (zeros ? 0 : 2);
    bad += diff > 1;
  }
  return bad;
}

/// Whether two float32 tensors agree within `rtol` of the second's largest magnitude (the same
/// float32 arithmetic in two instantiations of a kernel, which may contract a multiply-add
/// differently).
bool close(const rt::Tensor& a, const rt::Tensor& b, double rtol = 1e-6) {
  REQUIRE(a.numel() == b.numel());
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b.as<float>()[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(a.as<float>()[i]) - b.as<float>()[i]));
  }
  return worst <= rtol * std::max(scale, 1e-30);
}

TEST_CASE("cuda 16-bit activation gradients and CastGrad against the widened fallback") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const rt::Shape shape = {3, 257};
  const rt::Tensor x = attention::random(shape, 21, -6.0f, 6.0f);
  const rt::Tensor dy = attention::random(shape, 22);
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    CAPTURE(dtype_name(half));
    const rt::Tensor x16 = cast(x, half), dy16 = cast(dy, half);
    const rt::Tensor xw = cast(x16, DType::kFloat32), dyw = cast(dy16, DType::kFloat32);
    const rt::Tensor* none = nullptr;
    for (const auto& [op, approximate] : {std::pair<std::string, std::string>{"ReluGrad", ""},
                                          {"GeluGrad", "none"},
                                          {"GeluGrad", "tanh"},
                                          {"HardSwishGrad", ""}}) {
      CAPTURE(op);
      CAPTURE(approximate);
      const onnx::NodeProto n = node(op, 1, approximate);
      rt::Tensor native = rt::Tensor::owned(half, shape);
      attention::run(*cuda, n, {&x16, none, &dy16}, {&native});
      rt::Tensor wide = rt::Tensor::owned(DType::kFloat32, shape);
      attention::run(*cuda, n, {&xw, none, &dyw}, {&wide});
      CHECK(beyond_one_ulp(native, cast(wide, half)) == 0);
    }
    // Sigmoid's and Tanh's gradients read the forward output y.
    for (const std::string op : {"SigmoidGrad", "TanhGrad"}) {
      CAPTURE(op);
      onnx::NodeProto forward;
      forward.set_name("forward");
      forward.set_op_type(op == "SigmoidGrad" ? "Sigmoid" : "Tanh");
      rt::Tensor y = rt::Tensor::owned(DType::kFloat32, shape);
      attention::run(rt::cpu_backend(), forward, {&xw}, {&y});
      const rt::Tensor y16 = cast(y, half), yw = cast(y16, DType::kFloat32);
      const onnx::NodeProto n = node(op, 1);
      rt::Tensor native = rt::Tensor::owned(half, shape);
      attention::run(*cuda, n, {&x16, &y16, &dy16}, {&native});
      rt::Tensor wide = rt::Tensor::owned(DType::kFloat32, shape);
      attention::run(*cuda, n, {&xw, &yw, &dyw}, {&wide});
      CHECK(beyond_one_ulp(native, cast(wide, half)) == 0);
    }
    // CastGrad of a Cast from the 16-bit type up to float32: dx is dy rounded once.
    rt::Tensor dx = rt::Tensor::owned(half, shape);
    attention::run(*cuda, node("CastGrad", 1), {&x16, none, &dy}, {&dx});
    CHECK(beyond_one_ulp(dx, dy16) == 0);
    CHECK(std::memcmp(dx.data, dy16.data, static_cast<size_t>(dx.bytes())) == 0);
  }
}

TEST_CASE("cuda LayerNormalization and its gradient against the cpu: rows a warp and a block") {
  // Rows of 768 (a warp each: GPT-2's) and 5000 (a block each), float32, against the CPU
  // backend's kernels at rtol 1e-4 of each tensor's scale.
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  int compared = 0;
  for (int64_t inner : {768, 5000}) {
    CAPTURE(inner);
    const rt::Shape shape = {37, inner}, row = {inner}, stats = {37, 1};
    const rt::Tensor x = attention::random(shape, 41, -3.0f, 3.0f);
    const rt::Tensor scale = attention::random(row, 42, 0.5f, 1.5f);
    const rt::Tensor bias = attention::random(row, 43);
    const rt::Tensor dy = attention::random(shape, 44);
    onnx::NodeProto forward;
    forward.set_name("ln");
    forward.set_op_type("LayerNormalization");
    onnx::NodeProto backward = node("LayerNormalizationGrad", 3);
    const rt::Tensor* none = nullptr;
    std::vector<std::vector<rt::Tensor>> results;
    for (const rt::Backend* backend : {cuda, &rt::cpu_backend()}) {
      rt::Tensor y = rt::Tensor::owned(DType::kFloat32, shape),
                 mean = rt::Tensor::owned(DType::kFloat32, stats),
                 inv = rt::Tensor::owned(DType::kFloat32, stats);
      attention::run(*backend, forward, {&x, &scale, &bias}, {&y, &mean, &inv});
      rt::Tensor dx = rt::Tensor::owned(DType::kFloat32, shape),
                 ds = rt::Tensor::owned(DType::kFloat32, row),
                 db = rt::Tensor::owned(DType::kFloat32, row);
      attention::run(*backend, backward, {&x, &scale, &bias, none, &dy}, {&dx, &ds, &db});
      results.push_back({y, mean, inv, dx, ds, db});
    }
    const char* names[] = {"Y", "Mean", "InvStdDev", "dX", "dScale", "dBias"};
    for (size_t k = 0; k < results[0].size(); ++k) {
      const rt::Tensor& want = results[1][k];
      attention::check_close(results[0][k],
                             std::vector<double>(want.as<float>(), want.as<float>() + want.numel()),
                             1e-4, names[k]);
      ++compared;
    }
  }
  CHECK(compared == 12);
}

TEST_CASE("cuda 16-bit LayerNormalization and its gradient against the widened fallback") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const rt::Shape shape = {5, 300}, row = {300}, stats = {5, 1};
  const rt::Tensor x = attention::random(shape, 31, -3.0f, 3.0f);
  const rt::Tensor scale = attention::random(row, 32, 0.5f, 1.5f);
  const rt::Tensor bias = attention::random(row, 33);
  const rt::Tensor dy = attention::random(shape, 34);
  auto attrs = [](onnx::NodeProto& n) {
    onnx::AttributeProto* axis = n.add_attribute();
    axis->set_name("axis");
    axis->set_type(onnx::AttributeProto::INT);
    axis->set_i(-1);
    onnx::AttributeProto* eps = n.add_attribute();
    eps->set_name("epsilon");
    eps->set_type(onnx::AttributeProto::FLOAT);
    eps->set_f(1e-5f);
  };
  onnx::NodeProto forward;
  forward.set_name("ln");
  forward.set_op_type("LayerNormalization");
  attrs(forward);
  onnx::NodeProto backward = node("LayerNormalizationGrad", 3);
  attrs(backward);
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    CAPTURE(dtype_name(half));
    const rt::Tensor x16 = cast(x, half), s16 = cast(scale, half), b16 = cast(bias, half),
                     dy16 = cast(dy, half);
    const rt::Tensor xw = cast(x16, DType::kFloat32), sw = cast(s16, DType::kFloat32),
                     bw = cast(b16, DType::kFloat32), dyw = cast(dy16, DType::kFloat32);
    // Forward: Y 16-bit, Mean and InvStdDev float32.
    rt::Tensor y = rt::Tensor::owned(half, shape), mean = rt::Tensor::owned(DType::kFloat32, stats),
               inv = rt::Tensor::owned(DType::kFloat32, stats);
    attention::run(*cuda, forward, {&x16, &s16, &b16}, {&y, &mean, &inv});
    rt::Tensor yw = rt::Tensor::owned(DType::kFloat32, shape),
               mean_w = rt::Tensor::owned(DType::kFloat32, stats),
               inv_w = rt::Tensor::owned(DType::kFloat32, stats);
    attention::run(*cuda, forward, {&xw, &sw, &bw}, {&yw, &mean_w, &inv_w});
    CHECK(beyond_one_ulp(y, cast(yw, half)) == 0);
    CHECK(close(mean, mean_w));
    CHECK(close(inv, inv_w));
    // Gradient: the forward's inputs, its output Y (not read), dY.
    const rt::Tensor* none = nullptr;
    rt::Tensor dx = rt::Tensor::owned(half, shape), ds = rt::Tensor::owned(half, row),
               db = rt::Tensor::owned(half, row);
    attention::run(*cuda, backward, {&x16, &s16, &b16, none, &dy16}, {&dx, &ds, &db});
    rt::Tensor dxw = rt::Tensor::owned(DType::kFloat32, shape),
               dsw = rt::Tensor::owned(DType::kFloat32, row),
               dbw = rt::Tensor::owned(DType::kFloat32, row);
    attention::run(*cuda, backward, {&xw, &sw, &bw, none, &dyw}, {&dxw, &dsw, &dbw});
    CHECK(beyond_one_ulp(dx, cast(dxw, half)) == 0);
    CHECK(beyond_one_ulp(ds, cast(dsw, half)) == 0);
    CHECK(beyond_one_ulp(db, cast(dbw, half)) == 0);
  }
}

TEST_CASE("cuda 16-bit BatchNormalization and its gradient against the widened fallback") {
  // A mixed plan's BatchNormalization (opset 15 on): X, Y, dY and dX 16-bit, Scale, B and the
  // statistics float32. Inference and training mode (batch statistics, running ones written).
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const rt::Shape shape = {4, 3, 5, 7}, channels = {3};
  const rt::Tensor x = attention::random(shape, 41, -2.0f, 3.0f);
  const rt::Tensor dy = attention::random(shape, 42);
  const rt::Tensor scale = attention::random(channels, 43, 0.5f, 1.5f);
  const rt::Tensor bias = attention::random(channels, 44);
  const rt::Tensor mean = attention::random(channels, 45);
  const rt::Tensor var = attention::random(channels, 46, 0.5f, 2.0f);
  for (int training : {0, 1}) {
    CAPTURE(training);
    onnx::NodeProto forward;
    forward.set_name("bn");
    forward.set_op_type("BatchNormalization");
    onnx::AttributeProto* mode = forward.add_attribute();
    mode->set_name("training_mode");
    mode->set_type(onnx::AttributeProto::INT);
    mode->set_i(training);
    onnx::NodeProto backward = node("BatchNormalizationGrad", 5);
    *backward.add_attribute() = *mode;
    for (DType half : {DType::kBFloat16, DType::kFloat16}) {
      CAPTURE(dtype_name(half));
      const rt::Tensor x16 = cast(x, half), dy16 = cast(dy, half);
      const rt::Tensor xw = cast(x16, DType::kFloat32), dyw = cast(dy16, DType::kFloat32);
      rt::Tensor y = rt::Tensor::owned(half, shape), yw = rt::Tensor::owned(DType::kFloat32, shape);
      rt::Tensor rm = rt::Tensor::owned(DType::kFloat32, channels),
                 rv = rt::Tensor::owned(DType::kFloat32, channels),
                 rm_w = rt::Tensor::owned(DType::kFloat32, channels),
                 rv_w = rt::Tensor::owned(DType::kFloat32, channels);
      std::vector<rt::Tensor*> outs = {&y}, outs_w = {&yw};
      if (training) {
        outs = {&y, &rm, &rv};
        outs_w = {&yw, &rm_w, &rv_w};
      }
      attention::run(*cuda, forward, {&x16, &scale, &bias, &mean, &var}, outs);
      attention::run(*cuda, forward, {&xw, &scale, &bias, &mean, &var}, outs_w);
      CHECK(beyond_one_ulp(y, cast(yw, half)) == 0);
      if (training) {
        CHECK(close(rm, rm_w));
        CHECK(close(rv, rv_w));
      }
      // Gradient: the forward's 5 inputs, its output Y (not read), dY; dX 16-bit, dScale and dB
      // float32.
      const rt::Tensor* none = nullptr;
      rt::Tensor dx = rt::Tensor::owned(half, shape),
                 dxw = rt::Tensor::owned(DType::kFloat32, shape);
      rt::Tensor ds = rt::Tensor::owned(DType::kFloat32, channels),
                 db = rt::Tensor::owned(DType::kFloat32, channels),
                 ds_w = rt::Tensor::owned(DType::kFloat32, channels),
                 db_w = rt::Tensor::owned(DType::kFloat32, channels);
      // Every one of the forward's 5 inputs has an output place (none wanted for the statistics).
      attention::run(*cuda, backward, {&x16, &scale, &bias, &mean, &var, none, &dy16},
                     {&dx, &ds, &db, nullptr, nullptr});
      attention::run(*cuda, backward, {&xw, &scale, &bias, &mean, &var, none, &dyw},
                     {&dxw, &ds_w, &db_w, nullptr, nullptr});
      CHECK(beyond_one_ulp(dx, cast(dxw, half)) == 0);
      CHECK(close(ds, ds_w));
      CHECK(close(db, db_w));
    }
  }
}

TEST_CASE("cuda ReluGrad from Y (grad_reads: Relu's gradient reads Y) as from X") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const rt::Shape shape = {5, 129};
  const rt::Tensor x = attention::random(shape, 51, -2.0f, 2.0f);
  const rt::Tensor dy = attention::random(shape, 52);
  for (DType type : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    CAPTURE(dtype_name(type));
    const rt::Tensor xt = cast(x, type), dyt = cast(dy, type);
    // Y = Relu(X) by the CPU in float32 (exact: max(x, 0) of a widened value), in X's type.
    onnx::NodeProto relu;
    relu.set_name("relu");
    relu.set_op_type("Relu");
    const rt::Tensor xw = cast(xt, DType::kFloat32);
    rt::Tensor yw = rt::Tensor::owned(DType::kFloat32, shape);
    attention::run(rt::cpu_backend(), relu, {&xw}, {&yw});
    const rt::Tensor y = cast(yw, type);
    const rt::Tensor* none = nullptr;
    rt::Tensor from_x = rt::Tensor::owned(type, shape), from_y = rt::Tensor::owned(type, shape);
    attention::run(*cuda, node("ReluGrad", 1), {&xt, none, &dyt}, {&from_x});
    attention::run(*cuda, node("ReluGrad", 1), {&xt, &y, &dyt}, {&from_y});
    CHECK(std::memcmp(from_x.data, from_y.data, static_cast<size_t>(from_x.bytes())) == 0);
  }
}

TEST_CASE("cuda SoftmaxCrossEntropyLoss on 16-bit scores against the float32 kernels") {
  // A mixed plan's loss reads the head's 16-bit scores (passes::reads_sixteen_bit_scores): the
  // kernels widen each score as they read it and round the gradient once, so the loss is the
  // float32 kernel's on the widened scores to the bit and the gradient its rounding.
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const rt::Shape shape = {6, 301};
  const rt::Tensor scores = attention::random(shape, 61, -8.0f, 8.0f);
  rt::Tensor labels = rt::Tensor::owned(DType::kInt64, {6});
  const int64_t classes[6] = {3, 300, 0, -100, 17, 150};
  std::memcpy(labels.data, classes, sizeof classes);
  rt::Tensor dloss = rt::Tensor::owned(DType::kFloat32, {});
  dloss.as<float>()[0] = 1.0f;
  onnx::NodeProto forward;
  forward.set_name("loss");
  forward.set_op_type("SoftmaxCrossEntropyLoss");
  forward.set_domain(std::string(grad::kGradDomain));
  onnx::AttributeProto* ignore = forward.add_attribute();
  ignore->set_name("ignore_index");
  ignore->set_type(onnx::AttributeProto::INT);
  ignore->set_i(-100);
  onnx::NodeProto backward = node("SoftmaxCrossEntropyLossGrad", 3);
  *backward.add_attribute() = *ignore;
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    CAPTURE(dtype_name(half));
    const rt::Tensor s16 = cast(scores, half), sw = cast(s16, DType::kFloat32);
    rt::Tensor loss = rt::Tensor::owned(DType::kFloat32, {}),
               loss_w = rt::Tensor::owned(DType::kFloat32, {});
    attention::run(*cuda, forward, {&s16, &labels}, {&loss});
    attention::run(*cuda, forward, {&sw, &labels}, {&loss_w});
    CHECK(loss.as<float>()[0] == loss_w.as<float>()[0]);
    CHECK(std::isfinite(loss.as<float>()[0]));
    const rt::Tensor* none = nullptr;
    rt::Tensor dx = rt::Tensor::owned(half, shape), dxw = rt::Tensor::owned(DType::kFloat32, shape);
    attention::run(*cuda, backward, {&s16, &labels, none, &loss, &dloss}, {&dx, nullptr, nullptr});
    attention::run(*cuda, backward, {&sw, &labels, none, &loss_w, &dloss},
                   {&dxw, nullptr, nullptr});
    CHECK(beyond_one_ulp(dx, cast(dxw, half)) == 0);
  }
}

}  // namespace
}  // namespace stagecraft::testing
