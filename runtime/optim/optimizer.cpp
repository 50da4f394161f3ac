// The optimizers (see optimizer.h): the PyTorch-style `Optimizer`s and the ONNX training-domain
// operators, which drive the device's update kernels (runtime/core/device.h) with their scalars.
// Scalars (bias corrections, decayed rates) are computed in double and rounded once.
#include "runtime/optim/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/format/error.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::rt::optim {

// ---------------------------------------------------------------------------------------------
// Checks

namespace {

void expect_float(const Tensor& t, std::string_view what) {
  if (t.dtype != DType::kFloat32) {
    fail(ErrorKind::kUnsupported, "optimizer {} must be float32, got {}", what, t.describe());
  }
  if (t.is_bare())
    fail(ErrorKind::kInternal, "optimizer {} has no data", what);
}

void expect_like(const Tensor& t, const Tensor& weight, std::string_view what) {
  expect_float(t, what);
  if (t.shape != weight.shape) {
    fail(ErrorKind::kShape, "optimizer {} is {} but the weight is {}", what, t.describe(),
         weight.describe());
  }
}

void check_range(bool ok, std::string_view what, double value, std::string_view range) {
  if (!ok || !std::isfinite(value))
    fail(ErrorKind::kUsage, "optimizer {} must be {}, got {}", what, range, value);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// OptimizerState

Tensor& OptimizerState::at(const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail(ErrorKind::kInternal, "optimizer state has no tensor '{}'", name);
  return it->second;
}

const Tensor& OptimizerState::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail(ErrorKind::kInternal, "optimizer state has no tensor '{}'", name);
  return it->second;
}

int64_t OptimizerState::bytes() const {
  int64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.bytes();
  return total;
}

// ---------------------------------------------------------------------------------------------
// Optimizer

OptimizerState Optimizer::init_state(DeviceContext& device, const Tensor& weight) const {
  OptimizerState state;
  for (const std::string& name : state_names())
    state.tensors.emplace(name, device.new_tensor(DType::kFloat32, weight.shape, true));
  return state;
}

Tensor& Optimizer::state_tensor(DeviceContext& device, OptimizerState& state,
                                const std::string& name, const Tensor& weight) const {
  auto it = state.tensors.find(name);
  if (it == state.tensors.end()) {
    it = state.tensors.emplace(name, device.new_tensor(DType::kFloat32, weight.shape, true)).first;
  }
  expect_like(it->second, weight, fmt::format("state '{}'", name));
  return it->second;
}

void Optimizer::check_step(const Tensor& weight, const Tensor& grad, int64_t step) {
  expect_float(weight, "weight");
  expect_like(grad, weight, "gradient");
  if (step < 1) fail(ErrorKind::kInternal, "optimizer step {} (steps count from 1)", step);
}

void Optimizer::step_many(DeviceContext& device, std::span<const WeightStep> weights, float lr,
                          int64_t step) const {
  for (const WeightStep& w : weights) {
    this->step(device, *w.weight, *w.grad, *w.state, lr, step);
    device.fill_zero(*w.grad);
  }
}

namespace {

class Sgd final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::string> state_names() const override { return {}; }
  void step(DeviceContext& device, Tensor& weight, const Tensor& grad, OptimizerState&, float lr,
            int64_t step) const override {
    check_step(weight, grad, step);
    device.sgd(weight, grad, SgdUpdate{lr, config_.weight_decay});
  }
};

class Momentum final : public Optimizer {
 public:
  Momentum(OptimizerConfig config, bool nesterov)
      : Optimizer(std::move(config)), nesterov_(nesterov) {}
  std::vector<std::string> state_names() const override { return {"velocity"}; }
  void step(DeviceContext& device, Tensor& weight, const Tensor& grad, OptimizerState& state,
            float lr, int64_t step) const override {
    check_step(weight, grad, step);
    Tensor& v = state_tensor(device, state, "velocity", weight);
    MomentumUpdate p;
    p.lr = lr;
    p.l2 = config_.weight_decay;
    p.alpha = config_.momentum;
    p.beta = 1.0f;
    p.nesterov = nesterov_;
    device.momentum(weight, grad, v, p);
  }

 private:
  bool nesterov_;
};

class Adam final : public Optimizer {
 public:
  Adam(OptimizerConfig config, bool decoupled)
      : Optimizer(std::move(config)), decoupled_(decoupled) {}
  std::vector<std::string> state_names() const override { return {"m", "v"}; }
  void step(DeviceContext& device, Tensor& weight, const Tensor& grad, OptimizerState& state,
            float lr, int64_t step) const override {
    check_step(weight, grad, step);
    Tensor& m = state_tensor(device, state, "m", weight);
    Tensor& v = state_tensor(device, state, "v", weight);
    device.adam(weight, grad, m, v, update(lr, step));
  }

  void step_many(DeviceContext& device, std::span<const WeightStep> weights, float lr,
                 int64_t step) const override {
    std::vector<AdamTensors> items;
    items.reserve(weights.size());
    for (const WeightStep& w : weights) {
      check_step(*w.weight, *w.grad, step);
      Tensor& m = state_tensor(device, *w.state, "m", *w.weight);
      Tensor& v = state_tensor(device, *w.state, "v", *w.weight);
      items.push_back({w.weight, w.grad, &m, &v});
    }
    device.adam_many(items.data(), items.size(), update(lr, step), /*zero_grads=*/true);
  }

 private:
  // The scalars of one update (the same for every weight at a step).
  AdamUpdate update(float lr, int64_t step) const {
    const double t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(static_cast<double>(config_.beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(config_.beta2), t);
    AdamUpdate p;
    p.beta1 = config_.beta1;
    p.beta2 = config_.beta2;
    p.step_size = static_cast<float>(lr / bc1);
    p.denom_scale = static_cast<float>(1.0 / std::sqrt(bc2));
    p.eps = config_.epsilon;
    if (decoupled_) {
      p.pre_scale = static_cast<float>(1.0 - static_cast<double>(lr) * config_.weight_decay);
    } else {
      p.l2 = config_.weight_decay;
    }
    return p;
  }

  bool decoupled_;
};

class Adagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::string> state_names() const override { return {"sum"}; }
  void step(DeviceContext& device, Tensor& weight, const Tensor& grad, OptimizerState& state,
            float lr, int64_t step) const override {
    check_step(weight, grad, step);
    Tensor& h = state_tensor(device, state, "sum", weight);
    device.adagrad(weight, grad, h, AdagradUpdate{lr, config_.weight_decay, config_.epsilon});
  }
};

}  // namespace

namespace {

/// The optimizers the runtime implements (of the plan's vocabulary: not "none" nor "adam8bit").
constexpr OptimizerKind kRuntimeKinds[] = {OptimizerKind::kSgd,      OptimizerKind::kMomentum,
                                           OptimizerKind::kNesterov, OptimizerKind::kAdam,
                                           OptimizerKind::kAdamW,    OptimizerKind::kAdagrad};

}  // namespace

const std::vector<std::string_view>& optimizer_kinds() {
  static const std::vector<std::string_view> kinds = [] {
    std::vector<std::string_view> names;
    for (OptimizerKind kind : kRuntimeKinds) names.push_back(to_string(kind));
    return names;
  }();
  return kinds;
}

std::unique_ptr<Optimizer> Optimizer::make(const OptimizerConfig& c) {
  check_range(c.lr >= 0, "learning rate", c.lr, ">= 0");
  check_range(c.weight_decay >= 0, "weight decay", c.weight_decay, ">= 0");
  const OptimizerKind kind = c.kind;
  switch (kind) {
    case OptimizerKind::kSgd:
      return std::unique_ptr<Optimizer>(new Sgd(c));
    case OptimizerKind::kMomentum:
    case OptimizerKind::kNesterov:
      check_range(c.momentum >= 0, "momentum", c.momentum, ">= 0");
      return std::unique_ptr<Optimizer>(new Momentum(c, kind == OptimizerKind::kNesterov));
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      check_range(c.beta1 >= 0 && c.beta1 < 1, "beta1", c.beta1, "in [0, 1)");
      check_range(c.beta2 >= 0 && c.beta2 < 1, "beta2", c.beta2, "in [0, 1)");
      check_range(c.epsilon >= 0, "epsilon", c.epsilon, ">= 0");
      return std::unique_ptr<Optimizer>(new Adam(c, kind == OptimizerKind::kAdamW));
    case OptimizerKind::kAdagrad:
      check_range(c.epsilon >= 0, "epsilon", c.epsilon, ">= 0");
      return std::unique_ptr<Optimizer>(new Adagrad(c));
    case OptimizerKind::kNone:
    case OptimizerKind::kAdam8bit:
      break;
  }
  fail(ErrorKind::kUsage, "optimizer '{}' does not run here, only plans (expected one of: {})",
       to_string(c.kind), fmt::join(optimizer_kinds(), ", "));
}

// ---------------------------------------------------------------------------------------------
// ONNX training-domain operators

bool parse_onnx_momentum_mode(std::string_view mode) {
  if (mode == "standard") return false;
  if (mode == "nesterov") return true;
  fail(ErrorKind::kUnsupported, "Momentum mode '{}' (expected 'standard' or 'nesterov')", mode);
}

void onnx_adam(DeviceContext& device, const OnnxAdamAttrs& a, double r, int64_t t, Tensor& x,
               const Tensor& g, Tensor& v, Tensor& h) {
  expect_float(x, "X");
  expect_like(g, x, "G");
  expect_like(v, x, "V");
  expect_like(h, x, "H");
  // R_adjusted = T > 0 ? R * sqrt(1 - beta^T) / (1 - alpha^T) : R.
  double r_adjusted = r;
  if (t > 0) {
    const double td = static_cast<double>(t);
    r_adjusted = r * std::sqrt(1.0 - std::pow(static_cast<double>(a.beta), td)) /
                 (1.0 - std::pow(static_cast<double>(a.alpha), td));
  }
  AdamUpdate p;
  p.l2 = a.norm_coefficient;
  p.beta1 = a.alpha;
  p.beta2 = a.beta;
  p.step_size = static_cast<float>(r_adjusted);
  p.denom_scale = 1.0f;
  p.eps = a.epsilon;
  p.post_scale = 1.0f - a.norm_coefficient_post;
  device.adam(x, g, v, h, p);
}

void onnx_momentum(DeviceContext& device, const OnnxMomentumAttrs& a, double r, int64_t t,
                   Tensor& x, const Tensor& g, Tensor& v) {
  expect_float(x, "X");
  expect_like(g, x, "G");
  expect_like(v, x, "V");
  MomentumUpdate p;
  p.lr = static_cast<float>(r);
  p.l2 = a.norm_coefficient;
  p.alpha = a.alpha;
  p.beta = t > 0 ? a.beta : 1.0f;  // The gradient's coefficient is 1 at the first update.
  p.nesterov = a.nesterov;
  device.momentum(x, g, v, p);
}

void onnx_adagrad(DeviceContext& device, const OnnxAdagradAttrs& a, double r, int64_t t, Tensor& x,
                  const Tensor& g, Tensor& h) {
  expect_float(x, "X");
  expect_like(g, x, "G");
  expect_like(h, x, "H");
  const double rate = r / (1.0 + static_cast<double>(t) * a.decay_factor);
  device.adagrad(x, g, h, AdagradUpdate{static_cast<float>(rate), a.norm_coefficient, a.epsilon});
}

}  // namespace stagecraft::rt::optim
