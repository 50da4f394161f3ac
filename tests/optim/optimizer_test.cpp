// The optimizers and learning-rate schedules (runtime/optim): each PyTorch-style optimizer
// against a trajectory worked out from its formula, the ONNX training-domain operators against
// ONNX's own conformance cases (libonnx-testdata), how the two faces relate, and the schedules.
#include "runtime/optim/optimizer.h"

#include <doctest/doctest.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"
#include "runtime/optim/lr_schedule.h"

namespace fs = std::filesystem;
using namespace stagecraft;
using namespace stagecraft::rt;
using namespace stagecraft::rt::optim;

namespace {

// The device the updates run on: the CPU backend's (the kernels under test).
DeviceContext& dev() {
  static std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  return *device;
}

Tensor floats(const std::vector<float>& values, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  Tensor t = Tensor::owned(DType::kFloat32, shape);
  std::memcpy(t.data, values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> values(const Tensor& t) { return {t.as<float>(), t.as<float>() + t.numel()}; }

// |got - want| <= atol + rtol * |want| elementwise (numpy.allclose).
void check_close(const Tensor& got, const Tensor& want, const std::string& what, double rtol = 1e-5,
                 double atol = 1e-6) {
  INFO(what);
  REQUIRE(got.dtype == DType::kFloat32);
  REQUIRE(want.dtype == DType::kFloat32);
  REQUIRE(got.shape == want.shape);
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.as<float>()[i], w = want.as<float>()[i];
    INFO("element " << i << ": got " << g << ", want " << w);
    CHECK(std::fabs(g - w) <= atol + rtol * std::fabs(w));
  }
}

void check_values(const Tensor& got, const std::vector<double>& want, double rtol = 1e-5) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(got.as<float>()[i] == doctest::Approx(want[i]).epsilon(rtol));
  }
}

// The same gradients for every trajectory: three steps on w0 = [1, -2].
const std::vector<std::vector<float>> kGrads = {{1.0f, -0.5f}, {0.5f, 0.25f}, {-1.0f, 2.0f}};

// Runs `config` for three steps at lr = config.lr and returns the weight after each.
std::vector<Tensor> trajectory(const OptimizerConfig& config,
                               OptimizerState* final_state = nullptr) {
  auto opt = Optimizer::make(config);
  Tensor w = floats({1.0f, -2.0f});
  OptimizerState state = opt->init_state(dev(), w);
  std::vector<Tensor> out;
  for (size_t s = 0; s < kGrads.size(); ++s) {
    opt->step(dev(), w, floats(kGrads[s]), state, config.lr, static_cast<int64_t>(s) + 1);
    out.push_back(clone(w));
  }
  if (final_state) *final_state = state;
  return out;
}

OptimizerConfig config(const std::string& kind, float lr, float wd = 0.0f) {
  OptimizerConfig c;
  c.kind = parse_optimizer(kind);
  c.lr = lr;
  c.weight_decay = wd;
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PyTorch-style optimizers against hand-worked trajectories

TEST_CASE("sgd: w -= lr * (g + wd*w)") {
  // lr 0.1, wd 0.01. Step 1: w0 = 1 - 0.1*(1 + 0.01) = 0.899; w1 = -2 - 0.1*(-0.5 - 0.02) = -1.948.
  // Step 2: 0.899 - 0.1*(0.5 + 0.00899) = 0.848101; -1.948 - 0.1*(0.25 - 0.01948) = -1.971052.
  // Step 3: 0.848101 - 0.1*(-1 + 0.00848101) = 0.94725251; -1.971052 - 0.1*(2 - 0.01971052).
  auto w = trajectory(config("sgd", 0.1f, 0.01f));
  check_values(w[0], {0.899, -1.948});
  check_values(w[1], {0.848101, -1.971052});
  check_values(w[2], {0.94725251, -1.971052 - 0.1 * (2 - 0.01971052)});
  CHECK(Optimizer::make(config("sgd", 0.1f))->state_bytes_per_param() == 0);
}

TEST_CASE("momentum: PyTorch SGD(momentum=0.9, dampening=0)") {
  // lr 0.1, mu 0.9, wd 0. v1 = g1 = [1, -0.5]; w = [0.9, -1.95].
  // v2 = 0.9*v1 + g2 = [1.4, -0.2]; w = [0.76, -1.93].
  // v3 = 0.9*v2 + g3 = [0.26, 1.82]; w = [0.734, -2.112].
  OptimizerState state;
  auto w = trajectory(config("momentum", 0.1f), &state);
  check_values(w[0], {0.9, -1.95});
  check_values(w[1], {0.76, -1.93});
  check_values(w[2], {0.734, -2.112});
  check_values(state.at("velocity"), {0.26, 1.82});
  CHECK(state.tensors.size() == 1);

  // With wd 0.1 the decay joins the gradient before the velocity: g1' = [1.1, -0.7],
  // v1 = g1', w = [0.89, -1.93]; g2' = [0.589, 0.057], v2 = [1.579, -0.573], w = [0.7321, -1.8727].
  auto wd = trajectory(config("momentum", 0.1f, 0.1f));
  check_values(wd[0], {0.89, -1.93});
  check_values(wd[1], {0.7321, -1.8727});
}

TEST_CASE("nesterov: PyTorch SGD(momentum=0.9, nesterov=True)") {
  // v as for momentum; the step is g + mu*v. Step 1: [1 + 0.9, -0.5 - 0.45] -> w = [0.81, -1.905].
  // Step 2: v2 = [1.4, -0.2]: [0.5 + 1.26, 0.25 - 0.18] -> w = [0.634, -1.912].
  // Step 3: v3 = [0.26, 1.82]: [-1 + 0.234, 2 + 1.638] -> w = [0.7106, -2.2758].
  auto w = trajectory(config("nesterov", 0.1f));
  check_values(w[0], {0.81, -1.905});
  check_values(w[1], {0.634, -1.912});
  check_values(w[2], {0.7106, -2.2758});
}

TEST_CASE("adam: bias-corrected, L2 decay coupled to the gradient") {
  // lr 0.1, b1 0.9, b2 0.999, eps 1e-8. Step 1: m = 0.1 g, v = 0.001 g^2, m_hat = g,
  // v_hat = g^2, so w moves by lr * sign(g) (less eps): [0.9, -1.9].
  // Step 2 (element 0): m = 0.09 + 0.05 = 0.14, v = 0.000999 + 0.00025 = 0.001249;
  // m_hat = 0.14/0.19, v_hat = 0.001249/0.001999: w = 0.9 - 0.1*0.7368421/0.7904508 = 0.8067820.
  // Further digits and step 3 from the same formulas in double precision.
  OptimizerState state;
  auto w = trajectory(config("adam", 0.1f), &state);
  check_values(w[0], {0.900000001, -1.900000002});
  check_values(w[1], {0.8067820382981611, -1.8733662987078465});
  check_values(w[2], {0.7957037312938717, -1.9293561477010674});
  check_values(state.at("m"), {0.026, 0.182});
  check_values(state.at("v"), {0.002247751, 0.00431193775});
  CHECK(Optimizer::make(config("adam", 0.1f))->state_bytes_per_param() == 8);

  // wd 0.1: step 1 g' = [1.1, -0.7]: still lr * sign(g'); then the decayed weights feed g'.
  auto wd = trajectory(config("adam", 0.1f, 0.1f));
  check_values(wd[0], {0.9000000009090909, -1.9000000014285714});
  check_values(wd[1], {0.8057717968921709, -1.8395973867971898});
  check_values(wd[2], {0.7850508045178748, -1.8823514022050694});
}

TEST_CASE("adamw: decoupled decay w *= 1 - lr*wd, then the Adam step on g") {
  // lr 0.1, wd 0.1: step 1 w = [1*0.99 - 0.1, -2*0.99 + 0.1] = [0.89, -1.88]; the moments see
  // the raw gradient, so they equal plain Adam's.
  OptimizerState state;
  auto w = trajectory(config("adamw", 0.1f, 0.1f), &state);
  check_values(w[0], {0.890000001, -1.880000002});
  check_values(w[1], {0.7878820382881611, -1.8345662986878466});
  check_values(w[2], {0.7689249109009901, -1.872210484694189});
  check_values(state.at("m"), {0.026, 0.182});
}

TEST_CASE("step_many: each weight's step and a zeroed gradient, for every rule") {
  // A stage's weights updated at once (Adam and AdamW through DeviceContext::adam_many) must
  // leave the bytes the per-weight calls leave: weights, state (made on first use) and the
  // gradients zeroed for the next step. Three weights of different sizes, three updates, with
  // weight decay so every term of each rule moves.
  for (const std::string kind : {"sgd", "momentum", "nesterov", "adam", "adamw", "adagrad"}) {
    CAPTURE(kind);
    const OptimizerConfig c = config(kind, 0.05f, 0.01f);
    auto opt = Optimizer::make(c);
    const std::vector<int64_t> sizes = {2, 37, 1000};
    std::vector<Tensor> one_w, many_w, many_g;
    std::vector<OptimizerState> one_state(sizes.size()), many_state(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> w(static_cast<size_t>(sizes[k]));
      for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(3 * i + k)) * 2;
      one_w.push_back(floats(w));
      many_w.push_back(floats(w));
      many_g.push_back(floats(std::vector<float>(w.size())));
    }
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<Optimizer::WeightStep> steps;
      for (size_t k = 0; k < sizes.size(); ++k) {
        std::vector<float> g(static_cast<size_t>(sizes[k]));
        for (size_t i = 0; i < g.size(); ++i)
          g[i] = std::cos(static_cast<float>(i * step + k)) - 0.25f;
        opt->step(dev(), one_w[k], floats(g), one_state[k], c.lr, step);
        many_g[k] = floats(g);
        steps.push_back({&many_w[k], &many_g[k], &many_state[k]});
      }
      opt->step_many(dev(), steps, c.lr, step);
      for (size_t k = 0; k < sizes.size(); ++k) {
        CAPTURE(k);
        CHECK(values(many_w[k]) == values(one_w[k]));
        CHECK(values(many_g[k]) == std::vector<float>(static_cast<size_t>(sizes[k]), 0.0f));
        for (const std::string& name : opt->state_names())
          CHECK(values(many_state[k].at(name)) == values(one_state[k].at(name)));
      }
    }
  }
}

TEST_CASE("adagrad: PyTorch Adagrad (lr_decay 0, initial accumulator 0)") {
  // lr 0.1, eps 1e-10. Step 1: s = g^2, w -= 0.1*sign(g): [0.9, -1.9].
  // Step 2: s = [1.25, 0.3125]: w = [0.9 - 0.05/1.118034, -1.9 - 0.025/0.5590170].
  OptimizerConfig c = config("adagrad", 0.1f);
  c.epsilon = 1e-10f;
  OptimizerState state;
  auto w = trajectory(c, &state);
  check_values(w[0], {0.9, -1.9});
  check_values(w[1], {0.8552786404640043, -1.9447213595619957});
  check_values(w[2], {0.9219453071262265, -2.0410300420259735});
  check_values(state.at("sum"), {2.25, 4.3125});
}

TEST_CASE("optimizer: names, state and errors") {
  for (std::string_view kind : optimizer_kinds()) {
    auto opt = Optimizer::make(config(std::string(kind), 0.01f));
    Tensor w = floats({1, 2, 3, 4, 5, 6}, {2, 3});
    OptimizerState state = opt->init_state(dev(), w);
    CHECK(static_cast<int64_t>(state.tensors.size()) * 4 == opt->state_bytes_per_param());
    CHECK(state.bytes() == opt->state_bytes_per_param() * 6);
    for (const auto& [name, t] : state.tensors) {
      CHECK(t.shape == w.shape);
      CHECK(values(t) == std::vector<float>(6, 0.0f));
    }
    // A missing state is created on first use, like a fresh init_state.
    OptimizerState lazy;
    Tensor w2 = clone(w);
    opt->step(dev(), w, floats({1, 1, 1, 1, 1, 1}, {2, 3}), state, 0.01f, 1);
    opt->step(dev(), w2, floats({1, 1, 1, 1, 1, 1}, {2, 3}), lazy, 0.01f, 1);
    CHECK(values(w) == values(w2));
    CHECK(lazy.tensors.size() == state.tensors.size());
  }

  try {
    Optimizer::make(config("adam8bit", 0.1f));  // planned for, not run
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    CHECK(std::string(e.what()) ==
          "optimizer 'adam8bit' does not run here, only plans (expected one of: sgd, momentum, "
          "nesterov, adam, adamw, adagrad)");
  }
  OptimizerConfig bad = config("adam", 0.1f);
  bad.beta2 = 1.0f;
  CHECK_THROWS_AS(Optimizer::make(bad), Error);
  CHECK_THROWS_AS(Optimizer::make(config("sgd", -1.0f)), Error);

  auto adam = Optimizer::make(config("adam", 0.1f));
  Tensor w = floats({1, 2});
  OptimizerState state;
  try {
    adam->step(dev(), w, floats({1, 2, 3}), state, 0.1f, 1);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kShape);
  }
  Tensor w64 = Tensor::owned(DType::kFloat64, {2});
  try {
    adam->step(dev(), w64, w64, state, 0.1f, 1);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUnsupported);
  }
  state.tensors["m"] = Tensor::owned(DType::kFloat32, {3});
  CHECK_THROWS_AS(adam->step(dev(), w, floats({1, 2}), state, 0.1f, 1), Error);
  CHECK_THROWS_AS(adam->step(dev(), w, floats({1, 2}), state, 0.1f, 0), Error);
}

TEST_CASE("optimizer: a tensor big enough to run in parallel updates like a small one") {
  // 100000 elements cross the parallel threshold; each element's update is independent, so
  // element i must equal the same update done on a one-element tensor.
  const int64_t n = 100000;
  for (std::string kind : {"sgd", "nesterov", "adamw", "adagrad"}) {
    INFO(kind);
    auto opt = Optimizer::make(config(kind, 0.05f, 0.01f));
    Tensor w = Tensor::owned(DType::kFloat32, {n}), g = Tensor::owned(DType::kFloat32, {n});
    for (int64_t i = 0; i < n; ++i) {
      w.as<float>()[i] = std::sin(0.001f * static_cast<float>(i));
      g.as<float>()[i] = std::cos(0.003f * static_cast<float>(i));
    }
    Tensor w0 = clone(w);
    OptimizerState state;
    for (int64_t s = 1; s <= 2; ++s) opt->step(dev(), w, g, state, 0.05f, s);
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{777}, n / 2, n - 1}) {
      Tensor one = floats({w0.as<float>()[i]}), g1 = floats({g.as<float>()[i]});
      OptimizerState st;
      for (int64_t s = 1; s <= 2; ++s) opt->step(dev(), one, g1, st, 0.05f, s);
      CHECK(w.as<float>()[i] == doctest::Approx(one.as<float>()[0]).epsilon(1e-6));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// ONNX training-domain operators against ONNX's conformance cases

namespace {

const fs::path kNodeData = "/usr/share/libonnx-testdata/data/node";

struct OnnxCase {
  onnx::NodeProto node;
  std::vector<Tensor> inputs, outputs;
};

OnnxCase load_case(const std::string& name) {
  const fs::path dir = kNodeData / name;
  REQUIRE_MESSAGE(fs::exists(dir / "model.onnx"),
                  "libonnx-testdata is missing: run tools/setup.sh");
  onnx::ModelProto model;
  std::ifstream in(dir / "model.onnx", std::ios::binary);
  REQUIRE(model.ParseFromIstream(&in));
  REQUIRE(model.graph().node_size() == 1);
  OnnxCase c;
  c.node = model.graph().node(0);
  CHECK(c.node.domain() == "ai.onnx.preview.training");
  const fs::path data = dir / "test_data_set_0";
  for (int i = 0; i < c.node.input_size(); ++i) {
    c.inputs.push_back(read_tensor_pb((data / ("input_" + std::to_string(i) + ".pb")).string()));
  }
  for (int i = 0; i < c.node.output_size(); ++i) {
    c.outputs.push_back(read_tensor_pb((data / ("output_" + std::to_string(i) + ".pb")).string()));
  }
  return c;
}

const onnx::AttributeProto* attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

float float_attr(const onnx::NodeProto& node, const std::string& name, float fallback) {
  const auto* a = attribute(node, name);
  return a ? a->f() : fallback;
}

double scalar_r(const OnnxCase& c) {
  REQUIRE(c.inputs[0].dtype == DType::kFloat32);
  REQUIRE(c.inputs[0].numel() == 1);
  return c.inputs[0].as<float>()[0];
}

int64_t scalar_t(const OnnxCase& c) {
  REQUIRE(c.inputs[1].dtype == DType::kInt64);
  REQUIRE(c.inputs[1].numel() == 1);
  return c.inputs[1].as<int64_t>()[0];
}

// Runs a case of `tuple` tensors per optimized X ([R, T, X..., G..., S1..., S2...] in,
// [X_new..., S1_new..., S2_new...] out), calling `update(x, g, states)` on copies.
template <class Update>
void run_case(const std::string& name, int tuple, Update update) {
  OnnxCase c = load_case(name);
  const int inputs = static_cast<int>(c.inputs.size());
  REQUIRE((inputs - 2) % tuple == 0);
  const int n = (inputs - 2) / tuple;
  REQUIRE(static_cast<int>(c.outputs.size()) == n * (tuple - 1));
  for (int i = 0; i < n; ++i) {
    Tensor x = clone(c.inputs[2 + i]);
    const Tensor& g = c.inputs[2 + n + i];
    std::vector<Tensor> states;
    for (int k = 2; k < tuple; ++k) states.push_back(clone(c.inputs[2 + k * n + i]));
    update(c, x, g, states);
    check_close(x, c.outputs[i], name + ": X_new " + std::to_string(i));
    for (int k = 0; k < tuple - 2; ++k) {
      check_close(states[k], c.outputs[(k + 1) * n + i],
                  name + ": state " + std::to_string(k) + " of X " + std::to_string(i));
    }
  }
}

void run_adam_case(const std::string& name) {
  run_case(name, 4, [name](const OnnxCase& c, Tensor& x, const Tensor& g, std::vector<Tensor>& s) {
    OnnxAdamAttrs a;
    a.alpha = float_attr(c.node, "alpha", a.alpha);
    a.beta = float_attr(c.node, "beta", a.beta);
    a.epsilon = float_attr(c.node, "epsilon", a.epsilon);
    if (name == "test_adam_multiple" && !attribute(c.node, "epsilon")) {
      // A bug in the data, not in the spec: ONNX's generator computed these outputs with
      // epsilon = 1e-2 but left the attribute off the node (onnx/onnx#7749, fixed in #7763 by
      // adding the attribute; the outputs did not change). Data with the fix has the attribute.
      a.epsilon = 1e-2f;
    }
    a.norm_coefficient = float_attr(c.node, "norm_coefficient", a.norm_coefficient);
    a.norm_coefficient_post = float_attr(c.node, "norm_coefficient_post", a.norm_coefficient_post);
    onnx_adam(dev(), a, scalar_r(c), scalar_t(c), x, g, s[0], s[1]);
  });
}

void run_momentum_case(const std::string& name) {
  run_case(name, 3, [](const OnnxCase& c, Tensor& x, const Tensor& g, std::vector<Tensor>& s) {
    for (const char* required : {"alpha", "beta", "norm_coefficient", "mode"})
      REQUIRE(attribute(c.node, required));
    OnnxMomentumAttrs a;
    a.alpha = float_attr(c.node, "alpha", 0);
    a.beta = float_attr(c.node, "beta", 0);
    a.norm_coefficient = float_attr(c.node, "norm_coefficient", 0);
    a.nesterov = parse_onnx_momentum_mode(attribute(c.node, "mode")->s());
    onnx_momentum(dev(), a, scalar_r(c), scalar_t(c), x, g, s[0]);
  });
}

void run_adagrad_case(const std::string& name) {
  run_case(name, 3, [](const OnnxCase& c, Tensor& x, const Tensor& g, std::vector<Tensor>& s) {
    OnnxAdagradAttrs a;
    a.epsilon = float_attr(c.node, "epsilon", a.epsilon);
    a.decay_factor = float_attr(c.node, "decay_factor", a.decay_factor);
    a.norm_coefficient = float_attr(c.node, "norm_coefficient", a.norm_coefficient);
    onnx_adagrad(dev(), a, scalar_r(c), scalar_t(c), x, g, s[0]);
  });
}

}  // namespace

TEST_CASE("onnx: the attribute defaults are the operator schemas'") {
  auto f = [](const char* op, const char* attr) {
    const onnx::OpSchema* schema =
        onnx::OpSchemaRegistry::Schema(op, 1, "ai.onnx.preview.training");
    REQUIRE(schema);
    const auto& a = schema->attributes().at(attr);
    REQUIRE_FALSE(a.required);
    return a.default_value.f();
  };
  OnnxAdamAttrs adam;
  CHECK(adam.alpha == f("Adam", "alpha"));
  CHECK(adam.beta == f("Adam", "beta"));
  CHECK(adam.epsilon == f("Adam", "epsilon"));
  CHECK(adam.norm_coefficient == f("Adam", "norm_coefficient"));
  CHECK(adam.norm_coefficient_post == f("Adam", "norm_coefficient_post"));
  OnnxAdagradAttrs adagrad;
  CHECK(adagrad.epsilon == f("Adagrad", "epsilon"));
  CHECK(adagrad.decay_factor == f("Adagrad", "decay_factor"));
  CHECK(adagrad.norm_coefficient == f("Adagrad", "norm_coefficient"));
}

TEST_CASE("onnx: Adam conformance cases") {
  run_adam_case("test_adam");
  run_adam_case("test_adam_multiple");
}

TEST_CASE("onnx: Momentum conformance cases") {
  run_momentum_case("test_momentum");
  run_momentum_case("test_momentum_multiple");
  run_momentum_case("test_nesterov_momentum");
}

TEST_CASE("onnx: Adagrad conformance cases") {
  run_adagrad_case("test_adagrad");
  run_adagrad_case("test_adagrad_multiple");
}

TEST_CASE("onnx: the operators' building blocks match the spec's corner cases") {
  // Momentum at T = 0 takes the gradient with coefficient 1 whatever beta is; after that, beta.
  OnnxMomentumAttrs m{0.5f, 0.25f, 0.0f, false};
  Tensor x = floats({1.0f}), v = floats({0.0f});
  onnx_momentum(dev(), m, 0.1, 0, x, floats({2.0f}), v);  // v = 2, x = 0.8
  check_values(v, {2.0});
  check_values(x, {0.8});
  onnx_momentum(dev(), m, 0.1, 1, x, floats({2.0f}), v);  // v = 1 + 0.5, x = 0.65
  check_values(v, {1.5});
  check_values(x, {0.65});
  // Adam at T = 0 has no bias correction; norm_coefficient_post scales the result.
  OnnxAdamAttrs a;
  a.epsilon = 0.0f;
  a.norm_coefficient_post = 0.5f;
  Tensor xa = floats({1.0f}), va = floats({0.0f}), ha = floats({0.0f});
  onnx_adam(dev(), a, 0.1, 0, xa, floats({4.0f}), va,
            ha);  // v = 0.4, h = 0.016, x = 0.5*(1 - 0.1*0.4/0.126491)
  check_values(va, {0.4});
  check_values(ha, {0.016});
  check_values(xa, {0.5 * (1.0 - 0.1 * 0.4 / std::sqrt(0.016))});
  // Adagrad's rate decays as R / (1 + T*decay_factor).
  OnnxAdagradAttrs d;
  d.epsilon = 0.0f;
  d.decay_factor = 1.0f;
  Tensor xd = floats({1.0f}), hd = floats({0.0f});
  onnx_adagrad(dev(), d, 0.1, 3, xd, floats({3.0f}), hd);  // x = 1 - 0.025 * 3/3
  check_values(xd, {0.975});
  CHECK_THROWS_AS(parse_onnx_momentum_mode("heavy-ball"), Error);
}

TEST_CASE("onnx vs PyTorch-style: the relations the header states") {
  const std::vector<float> w0 = {0.5f, -1.5f, 2.0f};
  const std::vector<std::vector<float>> grads = {
      {0.3f, -0.2f, 1.0f}, {-0.1f, 0.4f, 0.5f}, {0.2f, 0.2f, -0.7f}};
  const float lr = 0.05f, wd = 0.01f;

  for (bool nesterov : {false, true}) {
    // Momentum: alpha = mu, beta = 1, norm_coefficient = wd, T = step - 1.
    auto opt = Optimizer::make(config(nesterov ? "nesterov" : "momentum", lr, wd));
    OnnxMomentumAttrs a{opt->config().momentum, 1.0f, wd, nesterov};
    Tensor w = floats(w0), x = floats(w0), v = floats({0, 0, 0});
    OptimizerState state;
    for (size_t s = 0; s < grads.size(); ++s) {
      opt->step(dev(), w, floats(grads[s]), state, lr, static_cast<int64_t>(s) + 1);
      onnx_momentum(dev(), a, lr, static_cast<int64_t>(s), x, floats(grads[s]), v);
      CHECK(values(w) == values(x));
      CHECK(values(state.at("velocity")) == values(v));
    }
  }
  {
    // Adam: alpha = b1, beta = b2, norm_coefficient = wd, T = step, epsilon = eps*sqrt(1 - b2^T).
    OptimizerConfig c = config("adam", lr, wd);
    c.epsilon = 1e-3f;  // big enough that its placement matters
    auto opt = Optimizer::make(c);
    Tensor w = floats(w0), x = floats(w0), m = floats({0, 0, 0}), h = floats({0, 0, 0});
    OptimizerState state;
    for (size_t s = 0; s < grads.size(); ++s) {
      const int64_t t = static_cast<int64_t>(s) + 1;
      opt->step(dev(), w, floats(grads[s]), state, lr, t);
      OnnxAdamAttrs a;
      a.alpha = c.beta1;
      a.beta = c.beta2;
      a.norm_coefficient = wd;
      a.epsilon =
          static_cast<float>(c.epsilon * std::sqrt(1.0 - std::pow(double{c.beta2}, double(t))));
      onnx_adam(dev(), a, lr, t, x, floats(grads[s]), m, h);
      check_close(w, x, "adam step " + std::to_string(t), 1e-6, 1e-7);
      check_close(state.at("m"), m, "m", 1e-6, 0);
      check_close(state.at("v"), h, "v", 1e-6, 0);
    }
  }
  {
    // Adagrad: norm_coefficient = wd, T = step - 1 (decay_factor 0 here, as in the optimizer).
    OptimizerConfig c = config("adagrad", lr, wd);
    auto opt = Optimizer::make(c);
    OnnxAdagradAttrs a;
    a.epsilon = c.epsilon;
    a.norm_coefficient = wd;
    Tensor w = floats(w0), x = floats(w0), h = floats({0, 0, 0});
    OptimizerState state;
    for (size_t s = 0; s < grads.size(); ++s) {
      opt->step(dev(), w, floats(grads[s]), state, lr, static_cast<int64_t>(s) + 1);
      onnx_adagrad(dev(), a, lr, static_cast<int64_t>(s), x, floats(grads[s]), h);
      CHECK(values(w) == values(x));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Learning-rate schedules

TEST_CASE("lr schedules") {
  LrSchedule constant{LrScheduleKind::kConstant, 0.1, 0, 0};
  CHECK(lr_at(constant, 1) == 0.1);
  CHECK(lr_at(constant, 1000000) == 0.1);
  constant.warmup_steps = 4;
  CHECK(lr_at(constant, 1) == doctest::Approx(0.025));
  CHECK(lr_at(constant, 4) == doctest::Approx(0.1));
  CHECK(lr_at(constant, 5) == doctest::Approx(0.1));

  // W = 10, T = 110: 0.01 per warm-up step, then down by 0.001 per step.
  LrSchedule linear{LrScheduleKind::kWarmupLinear, 0.1, 10, 110};
  CHECK(lr_at(linear, 1) == doctest::Approx(0.01));
  CHECK(lr_at(linear, 5) == doctest::Approx(0.05));
  CHECK(lr_at(linear, 10) == doctest::Approx(0.1));
  CHECK(lr_at(linear, 11) == doctest::Approx(0.099));
  CHECK(lr_at(linear, 60) == doctest::Approx(0.05));
  CHECK(lr_at(linear, 109) == doctest::Approx(0.001));
  CHECK(lr_at(linear, 110) == 0.0);
  CHECK(lr_at(linear, 500) == 0.0);

  LrSchedule cosine{LrScheduleKind::kCosine, 0.1, 10, 110};
  CHECK(lr_at(cosine, 5) == doctest::Approx(0.05));
  CHECK(lr_at(cosine, 10) == doctest::Approx(0.1));
  CHECK(lr_at(cosine, 35) == doctest::Approx(0.05 * (1 + std::cos(std::numbers::pi / 4))));
  CHECK(lr_at(cosine, 60) == doctest::Approx(0.05));
  CHECK(lr_at(cosine, 85) == doctest::Approx(0.05 * (1 - std::cos(std::numbers::pi / 4))));
  CHECK(lr_at(cosine, 110) == 0.0);
  // No warm-up: the first step already decays a little.
  LrSchedule cold{LrScheduleKind::kCosine, 1.0, 0, 4};
  CHECK(lr_at(cold, 1) == doctest::Approx(0.5 * (1 + std::cos(std::numbers::pi / 4))));
  CHECK(lr_at(cold, 2) == doctest::Approx(0.5));

  CHECK(parse_lr_schedule("constant") == LrScheduleKind::kConstant);
  CHECK(parse_lr_schedule("warmup-linear") == LrScheduleKind::kWarmupLinear);
  CHECK(parse_lr_schedule("cosine") == LrScheduleKind::kCosine);
  for (std::string_view name : lr_schedule_names())
    CHECK(to_string(parse_lr_schedule(name)) == name);
  try {
    parse_lr_schedule("step");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    CHECK(
        std::string(e.what()) ==
        "unknown learning-rate schedule 'step' (expected one of: constant, warmup-linear, cosine)");
  }
  CHECK_THROWS_AS(lr_at(LrSchedule{LrScheduleKind::kCosine, 0.1, 0, 0}, 1), Error);  // no total
  CHECK_THROWS_AS(lr_at(LrSchedule{LrScheduleKind::kWarmupLinear, 0.1, 20, 10}, 1),
                  Error);  // W > T
  CHECK_THROWS_AS(lr_at(linear, 0), Error);
}
