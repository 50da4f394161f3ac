// The optimizers (see optimizer.h): the shared inner loops, the PyTorch-style `Optimizer`s that
// drive them and the ONNX training-domain operators that drive the same loops with the spec's
// scalars. Scalars (bias corrections, decayed rates) are computed in double and rounded once.
#include "runtime/optim/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#if defined(__SSE__) || defined(__AVX__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "runtime/format/error.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::rt::optim {

namespace {

// Loops over at least this many elements use all of the calling thread's OpenMP threads.
constexpr int64_t kParallelElements = int64_t{1} << 15;

// The loops with a square root run block by block: GCC keeps std::sqrt scalar inside a loop
// unless built with -fno-math-errno (it must be able to set errno for a negative argument), so
// each block updates the moments in one vectorised loop, takes the square roots with the SIMD
// instruction (correctly rounded like std::sqrt, so results do not depend on the path) and
// then updates the weights in a second vectorised loop. A block stays in L1.
constexpr int64_t kBlock = 512;

void sqrt_in_place(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
#if defined(__SSE__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#elif defined(__aarch64__)
  for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vsqrtq_f32(vld1q_f32(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

// Calls body(begin, length) for consecutive blocks of [0, n), in parallel on big tensors.
template <class Body>
void for_blocks(int64_t n, Body body) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n >= kParallelElements)
  for (int64_t b = 0; b < blocks; ++b) body(b * kBlock, std::min(kBlock, n - b * kBlock));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Inner loops

namespace kernels {

void sgd(float* __restrict w, const float* __restrict g, int64_t n, float lr, float l2) {
#pragma omp parallel for simd if (n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + l2 * w[i]);
}

void momentum(float* __restrict w, const float* __restrict g, float* __restrict v, int64_t n,
              const MomentumParams& p) {
  const float lr = p.lr, l2 = p.l2, alpha = p.alpha, beta = p.beta;
  if (p.nesterov) {
#pragma omp parallel for simd if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const float gr = g[i] + l2 * w[i];
      const float vi = alpha * v[i] + beta * gr;
      v[i] = vi;
      w[i] -= lr * (gr + alpha * vi);
    }
  } else {
#pragma omp parallel for simd if (n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const float vi = alpha * v[i] + beta * (g[i] + l2 * w[i]);
      v[i] = vi;
      w[i] -= lr * vi;
    }
  }
}

void adam(float* w, const float* g, float* m, float* v, int64_t n, const AdamParams& p) {
  const float l2 = p.l2, b1 = p.beta1, b2 = p.beta2, c1 = 1.0f - p.beta1, c2 = 1.0f - p.beta2;
  const float step_size = p.step_size, denom_scale = p.denom_scale, eps = p.eps;
  const float pre = p.pre_scale, post = p.post_scale;
  for_blocks(n, [&](int64_t begin, int64_t len) {
    float* __restrict wb = w + begin;
    const float* __restrict gb = g + begin;
    float* __restrict mb = m + begin;
    float* __restrict vb = v + begin;
    float root[kBlock];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gr = gb[i] + l2 * wb[i];
      const float mi = b1 * mb[i] + c1 * gr;
      const float vi = b2 * vb[i] + c2 * (gr * gr);
      mb[i] = mi;
      vb[i] = vi;
      root[i] = vi;
    }
    sqrt_in_place(root, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      wb[i] = post * (pre * wb[i] - step_size * (mb[i] / (root[i] * denom_scale + eps)));
    }
  });
}

void adagrad(float* w, const float* g, float* h, int64_t n, float lr, float l2, float eps) {
  for_blocks(n, [&](int64_t begin, int64_t len) {
    float* __restrict wb = w + begin;
    const float* __restrict gb = g + begin;
    float* __restrict hb = h + begin;
    float root[kBlock];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gr = gb[i] + l2 * wb[i];
      const float hi = hb[i] + gr * gr;
      hb[i] = hi;
      root[i] = hi;
    }
    sqrt_in_place(root, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) wb[i] -= lr * ((gb[i] + l2 * wb[i]) / (root[i] + eps));
  });
}

}  // namespace kernels

// ---------------------------------------------------------------------------------------------
// Checks

namespace {

void expect_float(const Tensor& t, std::string_view what) {
  if (t.dtype != DType::kFloat32) {
    fail(ErrorKind::kUnsupported, "optimizer {} must be float32, got {}", what, t.describe());
  }
  if (t.data == nullptr && t.numel() > 0)
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

OptimizerState Optimizer::init_state(const Tensor& weight) const {
  OptimizerState state;
  for (const std::string& name : state_names())
    state.tensors.emplace(name, Tensor::owned(DType::kFloat32, weight.shape));
  return state;
}

Tensor& Optimizer::state_tensor(OptimizerState& state, const std::string& name,
                                const Tensor& weight) const {
  auto it = state.tensors.find(name);
  if (it == state.tensors.end()) {
    it = state.tensors.emplace(name, Tensor::owned(DType::kFloat32, weight.shape)).first;
  }
  expect_like(it->second, weight, fmt::format("state '{}'", name));
  return it->second;
}

void Optimizer::check_step(const Tensor& weight, const Tensor& grad, int64_t step) {
  expect_float(weight, "weight");
  expect_like(grad, weight, "gradient");
  if (step < 1) fail(ErrorKind::kInternal, "optimizer step {} (steps count from 1)", step);
}

namespace {

class Sgd final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::string> state_names() const override { return {}; }
  void step(Tensor& weight, const Tensor& grad, OptimizerState&, float lr,
            int64_t step) const override {
    check_step(weight, grad, step);
    kernels::sgd(weight.as<float>(), grad.as<float>(), weight.numel(), lr, config_.weight_decay);
  }
};

class Momentum final : public Optimizer {
 public:
  Momentum(OptimizerConfig config, bool nesterov)
      : Optimizer(std::move(config)), nesterov_(nesterov) {}
  std::vector<std::string> state_names() const override { return {"velocity"}; }
  void step(Tensor& weight, const Tensor& grad, OptimizerState& state, float lr,
            int64_t step) const override {
    check_step(weight, grad, step);
    Tensor& v = state_tensor(state, "velocity", weight);
    kernels::MomentumParams p;
    p.lr = lr;
    p.l2 = config_.weight_decay;
    p.alpha = config_.momentum;
    p.beta = 1.0f;
    p.nesterov = nesterov_;
    kernels::momentum(weight.as<float>(), grad.as<float>(), v.as<float>(), weight.numel(), p);
  }

 private:
  bool nesterov_;
};

class Adam final : public Optimizer {
 public:
  Adam(OptimizerConfig config, bool decoupled)
      : Optimizer(std::move(config)), decoupled_(decoupled) {}
  std::vector<std::string> state_names() const override { return {"m", "v"}; }
  void step(Tensor& weight, const Tensor& grad, OptimizerState& state, float lr,
            int64_t step) const override {
    check_step(weight, grad, step);
    Tensor& m = state_tensor(state, "m", weight);
    Tensor& v = state_tensor(state, "v", weight);
    const double t = static_cast<double>(step);
    const double bc1 = 1.0 - std::pow(static_cast<double>(config_.beta1), t);
    const double bc2 = 1.0 - std::pow(static_cast<double>(config_.beta2), t);
    kernels::AdamParams p;
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
    kernels::adam(weight.as<float>(), grad.as<float>(), m.as<float>(), v.as<float>(),
                  weight.numel(), p);
  }

 private:
  bool decoupled_;
};

class Adagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::vector<std::string> state_names() const override { return {"sum"}; }
  void step(Tensor& weight, const Tensor& grad, OptimizerState& state, float lr,
            int64_t step) const override {
    check_step(weight, grad, step);
    Tensor& h = state_tensor(state, "sum", weight);
    kernels::adagrad(weight.as<float>(), grad.as<float>(), h.as<float>(), weight.numel(), lr,
                     config_.weight_decay, config_.epsilon);
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
  std::optional<OptimizerKind> kind = find_optimizer(c.kind);
  switch (kind.value_or(OptimizerKind::kNone)) {
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
  fail(ErrorKind::kUsage, "unknown optimizer '{}' (expected one of: {})", c.kind,
       fmt::join(optimizer_kinds(), ", "));
}

// ---------------------------------------------------------------------------------------------
// ONNX training-domain operators

bool parse_onnx_momentum_mode(std::string_view mode) {
  if (mode == "standard") return false;
  if (mode == "nesterov") return true;
  fail(ErrorKind::kUnsupported, "Momentum mode '{}' (expected 'standard' or 'nesterov')", mode);
}

void onnx_adam(const OnnxAdamAttrs& a, double r, int64_t t, Tensor& x, const Tensor& g, Tensor& v,
               Tensor& h) {
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
  kernels::AdamParams p;
  p.l2 = a.norm_coefficient;
  p.beta1 = a.alpha;
  p.beta2 = a.beta;
  p.step_size = static_cast<float>(r_adjusted);
  p.denom_scale = 1.0f;
  p.eps = a.epsilon;
  p.post_scale = 1.0f - a.norm_coefficient_post;
  kernels::adam(x.as<float>(), g.as<float>(), v.as<float>(), h.as<float>(), x.numel(), p);
}

void onnx_momentum(const OnnxMomentumAttrs& a, double r, int64_t t, Tensor& x, const Tensor& g,
                   Tensor& v) {
  expect_float(x, "X");
  expect_like(g, x, "G");
  expect_like(v, x, "V");
  kernels::MomentumParams p;
  p.lr = static_cast<float>(r);
  p.l2 = a.norm_coefficient;
  p.alpha = a.alpha;
  p.beta = t > 0 ? a.beta : 1.0f;  // The gradient's coefficient is 1 at the first update.
  p.nesterov = a.nesterov;
  kernels::momentum(x.as<float>(), g.as<float>(), v.as<float>(), x.numel(), p);
}

void onnx_adagrad(const OnnxAdagradAttrs& a, double r, int64_t t, Tensor& x, const Tensor& g,
                  Tensor& h) {
  expect_float(x, "X");
  expect_like(g, x, "G");
  expect_like(h, x, "H");
  const double rate = r / (1.0 + static_cast<double>(t) * a.decay_factor);
  kernels::adagrad(x.as<float>(), g.as<float>(), h.as<float>(), x.numel(), static_cast<float>(rate),
                   a.norm_coefficient, a.epsilon);
}

}  // namespace stagecraft::rt::optim
