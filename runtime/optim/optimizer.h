#pragma once
/// \file
/// The training runtime's optimizers: the per-weight update applied after the backward pass.
/// All float32; each update is one pass over the weight, its gradient and its state, run by the
/// device's update kernels (runtime/core/device.h: SgdUpdate, MomentumUpdate, AdamUpdate,
/// AdagradUpdate; on the CPU, loops vectorised with `omp simd` and split among the calling
/// thread's OpenMP threads on big tensors). The rules here only derive the kernels' scalars.
///
/// Two faces share the same kernels:
///
///  * `Optimizer`, with PyTorch's `torch.optim` semantics so that a user gets what they expect
///    from the same hyper-parameters. `step` (1-based, counting this update) and the learning
///    rate (from an `LrSchedule`) are passed per call; `wd` is `weight_decay`, `mu` is
///    `momentum`, `g` the gradient and `w` the weight:
///
///      sgd       w -= lr * (g + wd*w)                              torch.optim.SGD(momentum=0)
///      momentum  v = mu*v + (g + wd*w);  w -= lr*v                 SGD(momentum=mu, dampening=0)
///      nesterov  g' = g + wd*w;  v = mu*v + g';  w -= lr*(g' + mu*v)  SGD(..., nesterov=True)
///      adam      g' = g + wd*w (L2, coupled);  m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2;
///                w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)   torch.optim.Adam
///      adamw     w *= 1 - lr*wd (decoupled), then the adam step with g' = g   torch.optim.AdamW
///      adagrad   g' = g + wd*w;  s += g'^2;  w -= lr * g' / (sqrt(s) + eps)
///                                  torch.optim.Adagrad(lr_decay=0, initial_accumulator_value=0)
///
///    The state starts at zero, so PyTorch's "first momentum step copies the gradient" is the
///    same as `v = mu*0 + g`. Note that PyTorch's defaults for eps differ per optimizer (Adam
///    1e-8, Adagrad 1e-10); `OptimizerConfig::epsilon` is used as given.
///
///  * `onnx_adam`, `onnx_momentum`, `onnx_adagrad`: the ONNX training-domain operators
///    (ai.onnx.preview.training Adam, Momentum, Adagrad, version 1) exactly as their specs
///    define them, for one (X, G, state) tuple; the multi-tensor forms apply them to each tuple.
///    How they relate to the PyTorch-style optimizers:
///
///      - ONNX Momentum is `v = alpha*v + beta'*(g + norm_coefficient*x)` with beta' = 1 at
///        T == 0 and `beta` after; `x -= R*v` ("standard") or `x -= R*(g' + alpha*v)`
///        ("nesterov"). With alpha = mu, beta = 1, norm_coefficient = wd it is exactly
///        `momentum` / `nesterov` above (T = step - 1; with beta = 1 T does not matter). With
///        beta = 1 - dampening and T = step - 1 it is PyTorch's dampened momentum, whose first
///        step also takes the undampened gradient.
///      - ONNX Adam adds epsilon to sqrt(H) *before* bias correction and applies the correction
///        only for T > 0: `x -= R*sqrt(1-beta^T)/(1-alpha^T) * v / (sqrt(h) + epsilon)`, then
///        `x *= 1 - norm_coefficient_post`. With T = step, alpha = b1, beta = b2,
///        norm_coefficient = wd and epsilon = eps*sqrt(1 - b2^step) it is `adam` above (same
///        maths, different eps placement: with the same epsilon ONNX's is in effect PyTorch's
///        eps/sqrt(1 - b2^step)). `norm_coefficient_post` is a decay applied *after* the step
///        (x = (1-p)*(x - update)) while AdamW decays *before* it (x = (1-lr*wd)*x - update):
///        the two differ by p*update, so ONNX Adam expresses AdamW only to first order.
///      - ONNX Adagrad is `r = R/(1 + T*decay_factor)`, then `adagrad` above with
///        norm_coefficient = wd: with T = step - 1 and decay_factor = lr_decay it is
///        torch.optim.Adagrad.
///
/// Errors: a bad optimizer name or hyper-parameter is `Error(kUsage)`; a weight, gradient or
/// state tensor that is not float32 is `Error(kUnsupported)`; mismatched shapes are
/// `Error(kShape)`; a step < 1 is `Error(kInternal)` (the caller counts steps).

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/tensor.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::rt::optim {

// ---------------------------------------------------------------------------------------------
// PyTorch-style optimizers

/// Hyper-parameters. `kind` is one of the plan vocabulary's optimizers the runtime implements
/// (`optimizer_kinds()`); fields a kind does not use are ignored (momentum by sgd/adam, betas by
/// sgd/momentum, epsilon by sgd/momentum/nesterov).
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 1e-3f;  ///< The base learning rate (an `LrSchedule` scales it per step).
  float weight_decay = 0.0f;
  float momentum = 0.9f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

/// The optimizer names `Optimizer::make` accepts (the vocabulary's optimizers the runtime
/// implements), in the order the usage error lists them.
const std::vector<std::string_view>& optimizer_kinds();

/// The per-weight state: named float32 tensors of the weight's shape. Names by kind:
/// momentum/nesterov "velocity"; adam/adamw "m" (first moment) and "v" (second moment);
/// adagrad "sum" (accumulated squared gradient); sgd none. Tensors own their bytes; a
/// checkpoint saves and restores them by name.
struct OptimizerState {
  std::map<std::string, Tensor> tensors;

  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  /// The tensor named `name`; `Error(kInternal)` when there is none.
  Tensor& at(const std::string& name);
  const Tensor& at(const std::string& name) const;
  /// Bytes held by all the state tensors.
  int64_t bytes() const;
};

class Optimizer {
 public:
  /// The optimizer for `config`. Throws `Error(kUsage)` for an unknown kind (the message lists
  /// the valid names) or a hyper-parameter out of range (lr, weight_decay, momentum, epsilon
  /// < 0; betas outside [0, 1)).
  static std::unique_ptr<Optimizer> make(const OptimizerConfig& config);

  virtual ~Optimizer() = default;

  const OptimizerConfig& config() const { return config_; }

  /// The names of the state tensors this optimizer keeps per weight (see `OptimizerState`).
  virtual std::vector<std::string> state_names() const = 0;

  /// Bytes of state per parameter: 0 (sgd), 4 (momentum, nesterov, adagrad), 8 (adam, adamw).
  int64_t state_bytes_per_param() const { return 4 * static_cast<int64_t>(state_names().size()); }

  /// A zero-filled state for `weight` on `device` (what a fresh run starts from).
  OptimizerState init_state(DeviceContext& device, const Tensor& weight) const;

  /// Updates `weight` in place from `grad` with learning rate `lr` at update number `step`
  /// (1-based: the first update is step 1; Adam's bias correction uses it), with `device`'s
  /// update kernel. State tensors that `state` lacks are created zero-filled on `device`;
  /// present ones must match the weight's shape.
  virtual void step(DeviceContext& device, Tensor& weight, const Tensor& grad,
                    OptimizerState& state, float lr, int64_t step) const = 0;

  /// One weight of `step_many`.
  struct WeightStep {
    Tensor* weight = nullptr;
    Tensor* grad = nullptr;
    OptimizerState* state = nullptr;
  };
  /// `step` on each of `weights` (a stage's, at one update), then each gradient zeroed: the
  /// same bytes as the calls one by one. Adam and AdamW hand the lot to the device at once
  /// (`DeviceContext::adam_many`); the others call `step` and `fill_zero` per weight.
  virtual void step_many(DeviceContext& device, std::span<const WeightStep> weights, float lr,
                         int64_t step) const;

 protected:
  explicit Optimizer(OptimizerConfig config) : config_(std::move(config)) {}
  /// Checks dtypes and shapes and returns the state tensor `name`, creating it when absent.
  Tensor& state_tensor(DeviceContext& device, OptimizerState& state, const std::string& name,
                       const Tensor& weight) const;
  static void check_step(const Tensor& weight, const Tensor& grad, int64_t step);

  OptimizerConfig config_;
};

// ---------------------------------------------------------------------------------------------
// ONNX training-domain operators (ai.onnx.preview.training, version 1)

/// Adam's attributes, with the spec's defaults.
struct OnnxAdamAttrs {
  float alpha = 0.9f;
  float beta = 0.999f;
  float epsilon = 1e-6f;
  float norm_coefficient = 0.0f;
  float norm_coefficient_post = 0.0f;
};

/// Momentum's attributes (all required by the spec).
struct OnnxMomentumAttrs {
  float alpha = 0.0f;
  float beta = 0.0f;
  float norm_coefficient = 0.0f;
  bool nesterov = false;  ///< mode "nesterov" (else "standard")
};

/// Adagrad's attributes, with the spec's defaults.
struct OnnxAdagradAttrs {
  float epsilon = 1e-6f;
  float decay_factor = 0.0f;
  float norm_coefficient = 0.0f;
};

/// The Momentum mode named `mode` ("standard" -> false, "nesterov" -> true);
/// `Error(kUnsupported)` otherwise.
bool parse_onnx_momentum_mode(std::string_view mode);

/// One ONNX Adam update of the tuple (x, g, v, h) with learning rate `r` and update count `t`,
/// in place on `device`: x <- X_final, v <- V_new, h <- H_new.
void onnx_adam(DeviceContext& device, const OnnxAdamAttrs& attrs, double r, int64_t t, Tensor& x,
               const Tensor& g, Tensor& v, Tensor& h);

/// One ONNX Momentum update of (x, g, v), in place on `device`: x <- X_new, v <- V_new.
void onnx_momentum(DeviceContext& device, const OnnxMomentumAttrs& attrs, double r, int64_t t,
                   Tensor& x, const Tensor& g, Tensor& v);

/// One ONNX Adagrad update of (x, g, h), in place on `device`: x <- X_new, h <- H_new.
void onnx_adagrad(DeviceContext& device, const OnnxAdagradAttrs& attrs, double r, int64_t t,
                  Tensor& x, const Tensor& g, Tensor& h);

}  // namespace stagecraft::rt::optim
