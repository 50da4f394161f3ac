// Finite-difference checks of the eltwise family's gradient kernels (runtime/cpu/grad_eltwise.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "runtime/core/backend.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

// Moves every element within `margin` of a kink to `margin` past it, so central differences
// with a small step stay on one side.
Tensor avoid(Tensor t, std::initializer_list<float> kinks, float margin = 0.05f) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    float& v = t.as<float>()[i];
    for (float k : kinks)
      if (std::fabs(v - k) < margin) v = v < k ? k - margin : k + margin;
  }
  return t;
}

Tensor scalar(float v, Shape shape = {}) {
  Tensor t = Tensor::owned(DType::kFloat32, shape);
  t.as<float>()[0] = v;
  return t;
}

Tensor bool_tensor(const Shape& shape, unsigned seed) {
  Tensor t = Tensor::owned(DType::kBool, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.as<uint8_t>()[i] = static_cast<uint8_t>(((i * 7 + seed) * 2654435761u >> 7) & 1);
  return t;
}

Tensor omitted() { return Tensor{}; }

GradCase make_case(const std::string& op, std::vector<Tensor> inputs, std::vector<bool> check,
                   int outputs = 1, std::function<void(onnx::NodeProto&)> attrs = {}) {
  GradCase c;
  c.op = op;
  c.inputs = std::move(inputs);
  c.check = std::move(check);
  c.outputs = outputs;
  c.attrs = std::move(attrs);
  return c;
}

void unary(const std::string& op, Tensor x, std::function<void(onnx::NodeProto&)> attrs = {},
           int opset = 17) {
  GradCase c;
  c.op = op;
  c.inputs = {std::move(x)};
  c.attrs = std::move(attrs);
  c.check = {true};
  c.opset = opset;
  gradcheck(c);
}

void binary(const std::string& op, Tensor a, Tensor b, std::vector<bool> check = {true, true},
            int samples = 24) {
  GradCase c;
  c.samples = samples;
  c.op = op;
  c.inputs = {std::move(a), std::move(b)};
  c.check = std::move(check);
  gradcheck(c);
}

const rt::KernelEntry* find_kernel(const std::string& op) {
  for (const rt::KernelEntry& e : rt::cpu_backend().table())
    if (e.op_type == op) return &e;
  return nullptr;
}

// Calls the gradient kernel `op` directly (n forward inputs, m outputs): inputs x..., y...,
// dy... (null where omitted), outputs dx... (null where not wanted).
void call_grad(const std::string& op, size_t n, std::vector<const Tensor*> in,
               std::vector<Tensor*> out, std::function<void(onnx::NodeProto&)> attrs = {}) {
  onnx::NodeProto node;
  node.set_op_type(op);
  set_int(node, std::string(grad::kForwardInputsAttr), static_cast<int64_t>(n));
  if (attrs) attrs(node);
  rt::Attrs a(node);
  const rt::KernelEntry* entry = find_kernel(op);
  REQUIRE(entry != nullptr);
  auto device = rt::cpu_backend().make_device(0, 1);
  rt::KernelArgs args{"g", op, a, in, out, *device};
  entry->run(args);
}

std::string check_grad(const std::string& op, size_t n, std::vector<DType> in,
                       std::vector<DType> out) {
  onnx::NodeProto node;
  set_int(node, std::string(grad::kForwardInputsAttr), static_cast<int64_t>(n));
  rt::Attrs a(node);
  const rt::KernelEntry* entry = find_kernel(op);
  REQUIRE(entry != nullptr);
  return entry->check(rt::OpSignature{op, in, out, a});
}

Tensor filled(const Shape& shape, float v) {
  Tensor t = Tensor::owned(DType::kFloat32, shape);
  std::fill_n(t.as<float>(), t.numel(), v);
  return t;
}

bool all_zero(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.as<float>()[i] != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("grad eltwise: checks") {
  const DType f = DType::kFloat32, u = DType::kUndefined;
  CHECK(check_grad("ReluGrad", 1, {f, f, f}, {f}) == "");
  CHECK(check_grad("ReluGrad", 1, {DType::kFloat64, DType::kFloat64, DType::kFloat64},
                   {DType::kFloat64}) != "");
  CHECK(check_grad("ReluGrad", 1, {f, f}, {f}) != "");
  CHECK(check_grad("AddGrad", 2, {f, f, f, f}, {f, u}) == "");
  CHECK(check_grad("AddGrad", 2, {DType::kInt64, DType::kInt64, DType::kInt64, u}, {u, u}) != "");
  CHECK(check_grad("ClipGrad", 3, {f, f, u, f, f}, {f, u, u}) == "");
  CHECK(check_grad("PowGrad", 2, {f, DType::kInt64, f, f}, {f, u}) == "");
  CHECK(check_grad("PowGrad", 2, {f, DType::kInt64, f, f}, {f, DType::kInt64}) != "");
  CHECK(check_grad("WhereGrad", 3, {DType::kBool, f, f, f, f}, {u, f, f}) == "");
  CHECK(check_grad("CastGrad", 1, {DType::kInt64, f, f}, {u}) == "");
  CHECK(check_grad("CastGrad", 1, {f, DType::kFloat16, DType::kFloat16}, {f}) == "");
  CHECK(check_grad("EqualGrad", 2, {DType::kInt64, DType::kInt64, DType::kBool, u}, {u, u}) == "");
  CHECK(check_grad("DropoutGrad", 3, {f, f, DType::kBool, f, DType::kBool, f, u}, {f, u, u}) == "");
}

// The message a call of `op` throws (empty when it throws none).
template <class Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every gradient family checks its operand counts with one rule (runtime/ops/grad_io.h), both
// when a program is loaded and when its kernel runs, and says the same thing when they are off.
TEST_CASE("grad ops: one arity rule, one message naming the node and the counts") {
  const DType f = DType::kFloat32, u = DType::kUndefined;
  Tensor x = random_tensor({1, 1, 3, 3}), w = random_tensor({1, 1, 1, 1}),
         dx = filled({1, 1, 3, 3}, 0);
  // ConvGrad with forward_inputs=3 and 4 inputs: an odd number left for y and dy.
  const std::string conv = error_of([&] {
    call_grad("ConvGrad", 3, {&x, &w, &x, &x}, {&dx, nullptr, nullptr});
  });
  CHECK(conv.find("ConvGrad 'g' with 4 inputs, 3 outputs and forward_inputs=3") !=
        std::string::npos);
  CHECK(conv.find("n = 2 to 3 forward inputs and m = 1 forward outputs") != std::string::npos);
  // MatMulGrad with 3 forward inputs; ReluGrad with fewer outputs than forward inputs.
  CHECK(error_of([&] {
          call_grad("MatMulGrad", 3, {&x, &x, &x, &x, &x}, {&dx, nullptr, nullptr});
        }).find("n = 2 forward inputs") != std::string::npos);
  CHECK(error_of([&] {
          call_grad("ReluGrad", 1, {&x, &x, &x}, {});
        }).find("ReluGrad 'g' with 3 inputs, 0 outputs") != std::string::npos);
  // The same rule when a program is loaded (no node name there: the program adds it).
  CHECK(check_grad("BatchNormalizationGrad", 5, {f, f, f, f, f, f}, {f, u, u, u, u}) ==
        "BatchNormalizationGrad with 6 inputs, 5 outputs and forward_inputs=5 breaks the "
        "gradient-op contract: expected n = 5 forward inputs and m = 1 to 3 forward outputs, so "
        "n + 2m inputs and n outputs");
  CHECK(check_grad("SoftmaxCrossEntropyLossGrad", 3, {f, DType::kInt64, u, f, f}, {f, u, u}) == "");
  CHECK(check_grad("SoftmaxCrossEntropyLossGrad", 4, {f, DType::kInt64, u, u, f, f}, {f, u, u, u})
            .find("n = 2 to 3 forward inputs") != std::string::npos);
  CHECK(check_grad("GemmGrad", 3, {f, f, f, f, f}, {f, f, f}) == "");
  CHECK(check_grad("SplitGrad", 1, {f, f, f, f, f}, {f}) == "");
}

TEST_CASE("grad eltwise: an omitted dy gives zeros") {
  Tensor x = random_tensor({2, 3}), b = random_tensor({3}), dx = filled({2, 3}, NAN),
         db = filled({3}, NAN);
  call_grad("ReluGrad", 1, {&x, &x, nullptr}, {&dx});
  CHECK(all_zero(dx));
  dx = filled({2, 3}, NAN);
  call_grad("MulGrad", 2, {&x, &b, &x, nullptr}, {&dx, &db});
  CHECK(all_zero(dx));
  CHECK(all_zero(db));
}

// Runs the forward kernel `op` directly with the run's random key `key`.
void call_forward(const std::string& op, std::vector<const Tensor*> in, std::vector<Tensor*> out,
                  uint64_t key, std::function<void(onnx::NodeProto&)> attrs = {}) {
  onnx::NodeProto node;
  node.set_op_type(op);
  if (attrs) attrs(node);
  rt::Attrs a(node);
  const rt::KernelEntry* entry = find_kernel(op);
  REQUIRE(entry != nullptr);
  auto device = rt::cpu_backend().make_device(0, 1);
  rt::KernelArgs args{"d", op, a, in, out, *device, key};
  entry->run(args);
}

Tensor bool_scalar(bool v) {
  Tensor t = Tensor::owned(DType::kBool, {});
  t.as<uint8_t>()[0] = v ? 1 : 0;
  return t;
}

TEST_CASE("Dropout in training mode: a seeded mask, scaled: its gradient reads that mask") {
  const Tensor x = random_tensor({64, 50}, 0.5f, 1.5f);  // no zeros: a dropped element is 0
  const Tensor training = bool_scalar(true);
  for (float r : {0.2f, 0.5f, 0.9f}) {
    CAPTURE(r);
    const Tensor ratio = scalar(r);
    Tensor y = filled(x.shape, 0), y2 = filled(x.shape, 0), y3 = filled(x.shape, 0);
    Tensor mask = Tensor::owned(DType::kBool, x.shape);
    Tensor other = Tensor::owned(DType::kBool, x.shape);
    call_forward("Dropout", {&x, &ratio, &training}, {&y, &mask}, 7);
    int64_t dropped = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const bool kept = mask.as<uint8_t>()[i] != 0;
      dropped += kept ? 0 : 1;
      CHECK(y.as<float>()[i] == (kept ? x.as<float>()[i] * (1.0f / (1.0f - r)) : 0.0f));
    }
    // 3200 draws: the dropped fraction within 4 standard deviations of the ratio.
    const double n = static_cast<double>(x.numel());
    CHECK(std::fabs(static_cast<double>(dropped) / n - r) < 4 * std::sqrt(r * (1 - r) / n));
    // The same key draws the same mask (no mask output needed); another key another mask.
    call_forward("Dropout", {&x, &ratio, &training}, {&y2}, 7);
    CHECK(std::equal(y.as<float>(), y.as<float>() + y.numel(), y2.as<float>()));
    call_forward("Dropout", {&x, &ratio, &training}, {&y3, &other}, 8);
    CHECK_FALSE(
        std::equal(mask.as<uint8_t>(), mask.as<uint8_t>() + mask.numel(), other.as<uint8_t>()));
    // So does the node's seed attribute.
    call_forward("Dropout", {&x, &ratio, &training}, {&y3, &other}, 7,
                 [](onnx::NodeProto& node) { set_int(node, "seed", 3); });
    CHECK_FALSE(
        std::equal(mask.as<uint8_t>(), mask.as<uint8_t>() + mask.numel(), other.as<uint8_t>()));

    // The gradient: dy through the forward's mask, scaled alike.
    const Tensor dy = random_tensor(x.shape, -1, 1, 5);
    Tensor dx = filled(x.shape, 0);
    call_grad("DropoutGrad", 3, {&x, &ratio, &training, &y, &mask, &dy, nullptr},
              {&dx, nullptr, nullptr});
    for (int64_t i = 0; i < x.numel(); ++i)
      CHECK(dx.as<float>()[i] ==
            (mask.as<uint8_t>()[i] != 0 ? dy.as<float>()[i] * (1.0f / (1.0f - r)) : 0.0f));
    // Without the mask it cannot know which elements were kept: refused.
    CHECK_THROWS_WITH_AS(
        call_grad("DropoutGrad", 3, {&x, &ratio, &training, &y, nullptr, &dy, nullptr},
                  {&dx, nullptr, nullptr}),
        doctest::Contains("needs the forward's bool mask"), Error);
  }
  // A ratio outside [0, 1) is refused naming it; a ratio of 0 is the identity.
  Tensor y = filled(x.shape, 0);
  const Tensor one = scalar(1.0f), zero = scalar(0.0f);
  CHECK_THROWS_WITH_AS(call_forward("Dropout", {&x, &one, &training}, {&y}, 7),
                       doctest::Contains("ratio 1 is outside [0, 1)"), Error);
  call_forward("Dropout", {&x, &zero, &training}, {&y}, 7);
  CHECK(std::equal(y.as<float>(), y.as<float>() + y.numel(), x.as<float>()));
  Tensor dx = filled(x.shape, 0);
  call_grad("DropoutGrad", 3, {&x, &zero, &training, &y, nullptr, &x, nullptr},
            {&dx, nullptr, nullptr});
  CHECK(std::equal(dx.as<float>(), dx.as<float>() + dx.numel(), x.as<float>()));
}

TEST_CASE("grad Dropout in training mode") {
  // The harness's forward runs draw one mask (the key of a run outside training), so the
  // finite differences see the function the gradient differentiates.
  for (float r : {0.25f, 0.5f}) {
    CAPTURE(r);
    GradCase c = make_case("Dropout", {random_tensor({3, 4, 5}), scalar(r), bool_scalar(true)},
                           {true, false, false}, 2);
    c.opset = 13;
    gradcheck(c);
  }
}

TEST_CASE("grad Relu") {
  unary("Relu", avoid(random_tensor({3, 4, 5}), {0}));
  unary("Relu", avoid(random_tensor({7}, -1, 1, 3), {0}));
}

TEST_CASE("grad Sigmoid") { unary("Sigmoid", random_tensor({3, 4}, -4, 4)); }
TEST_CASE("grad Tanh") { unary("Tanh", random_tensor({3, 4}, -2, 2)); }
TEST_CASE("grad Sqrt") { unary("Sqrt", random_tensor({3, 4}, 0.5f, 3)); }
TEST_CASE("grad Erf") { unary("Erf", random_tensor({2, 3, 4}, -2, 2)); }

// The fused Gelu (domain ai.stagecraft, passes/fuse_gelu.cpp), both forms, over both tails.
TEST_CASE("grad Gelu") {
  for (const char* approximate : {"none", "tanh"}) {
    CAPTURE(approximate);
    GradCase c;
    c.op = "Gelu";
    c.domain = std::string(grad::kGradDomain);
    c.output_shapes = {{3, 4, 5}};
    c.inputs = {random_tensor({3, 4, 5}, -5, 5)};
    c.check = {true};
    c.attrs = [=](onnx::NodeProto& n) { set_string(n, "approximate", approximate); };
    gradcheck(c);
  }
}

TEST_CASE("grad HardSigmoid") {
  unary("HardSigmoid", avoid(random_tensor({4, 6}, -4, 4), {-2.5f, 2.5f}));  // defaults 0.2, 0.5
  unary("HardSigmoid", avoid(random_tensor({4, 6}, -3, 3, 5), {-1.2f, 0.8f}),
        [](onnx::NodeProto& n) {
          set_float(n, "alpha", 0.5f);
          set_float(n, "beta", 0.6f);
        });
}

TEST_CASE("grad HardSwish") { unary("HardSwish", avoid(random_tensor({3, 5}, -5, 5), {-3, 3})); }

TEST_CASE("grad LeakyRelu") {
  unary("LeakyRelu", avoid(random_tensor({3, 5}, -2, 2), {0}),
        [](onnx::NodeProto& n) { set_float(n, "alpha", 0.1f); });
}

TEST_CASE("grad Clip") {
  Tensor x = avoid(random_tensor({3, 5}, -2, 2), {-0.5f, 0.7f});
  SUBCASE("min and max inputs") {
    gradcheck(make_case("Clip", {x, scalar(-0.5f), scalar(0.7f)}, {true, false, false}));
  }
  SUBCASE("min input only") { gradcheck(make_case("Clip", {x, scalar(-0.5f)}, {true, false})); }
  SUBCASE("max input only") {
    gradcheck(make_case("Clip", {x, omitted(), scalar(0.7f)}, {true, false, false}));
  }
  SUBCASE("no bounds") { unary("Clip", x); }
  SUBCASE("opset 6 attributes") {
    unary(
        "Clip", x,
        [](onnx::NodeProto& n) {
          set_float(n, "min", -0.5f);
          set_float(n, "max", 0.7f);
        },
        6);
  }
}

TEST_CASE("grad Dropout") {
  Tensor x = random_tensor({3, 4});
  SUBCASE("x only") { unary("Dropout", x); }
  SUBCASE("with mask output") { gradcheck(make_case("Dropout", {x}, {true}, 2)); }
  SUBCASE("ratio and training_mode false") {
    Tensor training = Tensor::owned(DType::kBool, {});
    gradcheck(make_case("Dropout", {x, scalar(0.3f), training}, {true, false, false}, 2));
  }
  SUBCASE("opset 7, is_test default") { unary("Dropout", x, {}, 7); }
}

TEST_CASE("grad Cast") {
  SUBCASE("float32 to float32") {
    unary("Cast", random_tensor({2, 5}), [](onnx::NodeProto& n) { set_int(n, "to", 1); });
  }
  SUBCASE("float32 to float64 (no float32 output gradient)") {
    unary("Cast", random_tensor({2, 5}), [](onnx::NodeProto& n) { set_int(n, "to", 11); });
  }
  SUBCASE("int64 to float32 (no input gradient)") {
    gradcheck(make_case("Cast", {int64_tensor({3}, {1, 2, 3})}, {false}, 1,
                        [](onnx::NodeProto& n) { set_int(n, "to", 1); }));
  }
}

TEST_CASE("grad Add") {
  binary("Add", random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({2, 3, 4}, -1, 1, 2));
  binary("Add", random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({4}, -1, 1, 2));
  binary("Add", random_tensor({3, 1}, -1, 1, 1), random_tensor({2, 1, 4}, -1, 1, 2));
  binary("Add", random_tensor({}, -1, 1, 1), random_tensor({2, 3}, -1, 1, 2));
  binary("Add", random_tensor({2, 3}, -1, 1, 1), random_tensor({1, 1}, -1, 1, 2), {true, false});
}

TEST_CASE("grad Add: large (threaded paths)") {
  binary("Add", random_tensor({48, 32, 24}, -1, 1, 1), random_tensor({32, 1}, -1, 1, 2),
         {true, true}, 8);
}

TEST_CASE("grad Mul: large (threaded paths)") {
  binary("Mul", random_tensor({64, 1, 300}, -1, 1, 1), random_tensor({2, 300}, -1, 1, 2),
         {true, true}, 8);
}

TEST_CASE("grad Add: large, summed to one row and to a scalar") {
  binary("Add", random_tensor({120, 300}, -1, 1, 1), random_tensor({300}, -1, 1, 2), {false, true},
         8);
  binary("Add", random_tensor({120, 300}, -1, 1, 1), random_tensor({}, -1, 1, 2), {false, true}, 8);
}

TEST_CASE("grad Sub") {
  binary("Sub", random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({2, 3, 4}, -1, 1, 2));
  binary("Sub", random_tensor({4}, -1, 1, 1), random_tensor({2, 3, 4}, -1, 1, 2));
  binary("Sub", random_tensor({2, 1, 4}, -1, 1, 1), random_tensor({3, 1}, -1, 1, 2));
  binary("Sub", random_tensor({2, 3}, -1, 1, 1), random_tensor({}, -1, 1, 2), {false, true});
}

TEST_CASE("grad Mul") {
  binary("Mul", random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({2, 3, 4}, -1, 1, 2));
  binary("Mul", random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({3, 1}, -1, 1, 2));
  binary("Mul", random_tensor({1, 4}, -1, 1, 1), random_tensor({5, 2, 1, 1}, -1, 1, 2));
  binary("Mul", random_tensor({}, -1, 1, 1), random_tensor({6}, -1, 1, 2));
}

TEST_CASE("grad Div") {
  binary("Div", random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({2, 3, 4}, 0.5f, 2, 2));
  binary("Div", random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({4}, 0.5f, 2, 2));
  binary("Div", random_tensor({3, 1}, -1, 1, 1), random_tensor({2, 1, 4}, -2, -0.5f, 2));
  binary("Div", random_tensor({}, -1, 1, 1), random_tensor({2, 3}, 0.5f, 2, 2));
}

TEST_CASE("grad Pow") {
  binary("Pow", random_tensor({2, 3, 4}, 0.5f, 2, 1), random_tensor({2, 3, 4}, -2, 2, 2));
  binary("Pow", random_tensor({2, 3, 4}, 0.5f, 2, 1), random_tensor({4}, -2, 2, 2));
  binary("Pow", random_tensor({3}, 0.5f, 2, 1), random_tensor({2, 3}, -2, 2, 2));
  binary("Pow", random_tensor({2, 3}, -2, 2, 1), scalar(2.0f), {true, false});
  binary("Pow", random_tensor({2, 3}, -2, 2, 1), scalar(3.0f), {true, false});
  binary("Pow", random_tensor({2, 3}, 0.5f, 2, 1), scalar(3.0f), {true, true});
  binary("Pow", random_tensor({2, 3}, -2, 2, 1), int64_tensor({}, {3}), {true, false});
}

TEST_CASE("grad Where") {
  SUBCASE("same shapes") {
    gradcheck(make_case("Where",
                        {bool_tensor({2, 3, 4}, 1), random_tensor({2, 3, 4}, -1, 1, 1),
                         random_tensor({2, 3, 4}, -1, 1, 2)},
                        {false, true, true}));
  }
  SUBCASE("broadcast") {
    gradcheck(make_case("Where",
                        {bool_tensor({2, 3, 4}, 3), random_tensor({3, 4}, -1, 1, 1),
                         random_tensor({2, 1, 4}, -1, 1, 2)},
                        {false, true, true}));
  }
  SUBCASE("broadcast condition and scalar") {
    gradcheck(make_case(
        "Where",
        {bool_tensor({3, 1}, 5), random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({}, -1, 1, 2)},
        {false, true, true}));
  }
}

TEST_CASE("grad Equal") {
  gradcheck(make_case("Equal", {random_tensor({2, 3}), random_tensor({3})}, {false, false}));
}

// Issue 15's unary maths (runtime/cpu/unary_math.cpp).
TEST_CASE("grad Exp") { unary("Exp", random_tensor({3, 4}, -2, 2)); }
TEST_CASE("grad Log") { unary("Log", random_tensor({3, 4}, 0.3f, 3)); }
TEST_CASE("grad Reciprocal") { unary("Reciprocal", random_tensor({3, 4}, 0.5f, 3)); }
TEST_CASE("grad Neg") { unary("Neg", random_tensor({2, 3, 4})); }
TEST_CASE("grad Abs") { unary("Abs", avoid(random_tensor({4, 5}, -2, 2), {0})); }

TEST_CASE("grad Ceil and Floor: zero away from the integers") {
  const Tensor x = avoid(random_tensor({4, 5}, -2.5f, 2.5f), {-2, -1, 0, 1, 2});
  unary("Ceil", x);
  unary("Floor", x);
  Tensor dx = filled({4, 5}, NAN), dy = filled({4, 5}, 1);
  call_grad("FloorGrad", 1, {&x, &x, &dy}, {&dx});
  CHECK(all_zero(dx));
}

TEST_CASE("grad Sin and Cos") {
  unary("Sin", random_tensor({3, 4}, -4, 4));
  unary("Cos", random_tensor({3, 4}, -4, 4, 3));
}

TEST_CASE("grad Sign and Round: zero away from their steps") {
  unary("Sign", avoid(random_tensor({4, 5}, -2, 2), {0}));
  unary("Round", avoid(random_tensor({4, 5}, -2.4f, 2.4f), {-1.5f, -0.5f, 0.5f, 1.5f}));
  const Tensor x = avoid(random_tensor({4, 5}, -2, 2), {0});
  Tensor dx = filled({4, 5}, NAN), dy = filled({4, 5}, 1);
  call_grad("SignGrad", 1, {&x, &x, &dy}, {&dx});
  CHECK(all_zero(dx));
}

// Issue 15's activations (runtime/cpu/activations.cpp).
TEST_CASE("grad Elu") {
  unary("Elu", avoid(random_tensor({3, 5}, -3, 2), {0}));
  unary("Elu", avoid(random_tensor({3, 5}, -3, 2, 4), {0}),
        [](onnx::NodeProto& n) { set_float(n, "alpha", 0.5f); });
}

TEST_CASE("grad Celu") {
  unary("Celu", avoid(random_tensor({3, 5}, -3, 2), {0}));
  unary("Celu", avoid(random_tensor({3, 5}, -3, 2, 4), {0}),
        [](onnx::NodeProto& n) { set_float(n, "alpha", 0.5f); });
}

TEST_CASE("grad Selu") {
  unary("Selu", avoid(random_tensor({3, 5}, -3, 2), {0}));
  unary("Selu", avoid(random_tensor({3, 5}, -3, 2, 4), {0}), [](onnx::NodeProto& n) {
    set_float(n, "alpha", 2.0f);
    set_float(n, "gamma", 3.0f);
  });
}

TEST_CASE("grad Softplus") { unary("Softplus", random_tensor({4, 5}, -4, 4)); }

TEST_CASE("grad PRelu: the slope's gradient summed over its broadcast axes") {
  SUBCASE("per channel, as torch's nn.PReLU(C) exports it") {
    binary("PRelu", avoid(random_tensor({2, 3, 4, 4}, -1, 1, 1), {0}),
           random_tensor({3, 1, 1}, 0, 0.5f, 2));
  }
  SUBCASE("one slope") {
    binary("PRelu", avoid(random_tensor({2, 3, 4}, -1, 1, 3), {0}), random_tensor({1}, 0, 1, 4));
  }
  SUBCASE("same shape") {
    binary("PRelu", avoid(random_tensor({3, 4}, -1, 1, 5), {0}), random_tensor({3, 4}, -1, 1, 6));
  }
  SUBCASE("trailing axis") {
    binary("PRelu", avoid(random_tensor({2, 3, 5}, -1, 1, 7), {0}), random_tensor({5}, -1, 1, 8));
  }
}

// Issue 15's Min, Max and Mod (runtime/cpu/compare_logic.cpp).
TEST_CASE("grad Min and Max: dy to the selected input, summed over broadcast axes") {
  for (const char* op : {"Min", "Max"}) {
    CAPTURE(op);
    binary(op, random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({2, 3, 4}, -1, 1, 2));
    binary(op, random_tensor({2, 3, 4}, -1, 1, 3), random_tensor({4}, -1, 1, 4));
    gradcheck(make_case(op,
                        {random_tensor({3, 1}, -1, 1, 5), random_tensor({2, 1, 4}, -1, 1, 6),
                         random_tensor({4}, -1, 1, 7)},
                        {true, true, true}));
    unary(op, random_tensor({2, 5}, -1, 1, 8));
  }
}

TEST_CASE("grad Max: tied inputs share dy evenly") {
  Tensor a = filled({2, 2}, 1), b = filled({2, 2}, 1), c = filled({2, 2}, 0.5f),
         dy = filled({2, 2}, 3), da = filled({2, 2}, NAN), db = filled({2, 2}, NAN),
         dc = filled({2, 2}, NAN);
  call_grad("MaxGrad", 3, {&a, &b, &c, &a, &dy}, {&da, &db, &dc});
  CHECK(da.as<float>()[3] == 1.5f);
  CHECK(db.as<float>()[0] == 1.5f);
  CHECK(all_zero(dc));
  // Without the forward output, it is recomputed.
  call_grad("MaxGrad", 3, {&a, &b, &c, nullptr, &dy}, {&da, &db, &dc});
  CHECK(da.as<float>()[1] == 1.5f);
}

// a = b * (q + f) with q an integer and f in [0.2, 0.8]: fmod(a, b) stays away from its jumps.
TEST_CASE("grad Mod (fmod=1): dy to the dividend, -dy * trunc(a / b) to the divisor") {
  const Tensor b = random_tensor({3}, 0.6f, 1.5f, 2), f = random_tensor({2, 3}, 0.2f, 0.8f, 3),
               q = random_tensor({2, 3}, -2.99f, 2.99f, 4);
  Tensor a = Tensor::owned(DType::kFloat32, {2, 3});
  for (int64_t i = 0; i < 6; ++i)
    a.as<float>()[i] = b.as<float>()[i % 3] * (std::trunc(q.as<float>()[i]) + f.as<float>()[i]);
  gradcheck(
      make_case("Mod", {a, b}, {true, true}, 1, [](onnx::NodeProto& n) { set_int(n, "fmod", 1); }));
  CHECK(check_grad("ModGrad", 2,
                   {DType::kFloat32, DType::kFloat32, DType::kFloat32, DType::kFloat32},
                   {DType::kFloat32, DType::kUndefined})
            .find("needs fmod=1") != std::string::npos);
}

}  // namespace stagecraft::testing
