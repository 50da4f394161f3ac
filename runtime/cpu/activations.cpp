// Activations of issue 15 and their gradients (see families.h): Elu, Selu, Celu, Softplus and
// PRelu, on float32 and float64. Float32 Elu and Softplus run as oneDNN eltwise primitives (elu,
// soft_relu); Selu, float64 and PRelu are plain C++ loops (PRelu's slope broadcasts to X any
// way numpy allows, which the broadcasting loop of eltwise_common.h walks as fast as oneDNN's
// binary primitive on these memory-bound ops). Gradients are float32 (contract:
// runtime/format/grad_ops.h) and, as PyTorch's, take the negative side's slope at 0: Elu
// dx = dy for x > 0, dy * alpha * e^x else; Selu gamma times that; Celu dy * e^(x / alpha) else;
// Softplus dy * sigmoid(x); PRelu dx = dy for x > 0, dy * slope else, and d slope = dy * x where x
// <= 0, summed over the axes along which the slope was broadcast. Gelu (fused, domain
// ai.stagecraft: passes/fuse_gelu.cpp) runs float32 as oneDNN's gelu_erf or gelu_tanh primitive and
// float64 through runtime/ops/gelu_element.h, which its gradient (from x alone) and the CUDA
// kernels share.
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/grad_eltwise_common.h"
#include "runtime/ops/gelu_element.h"

namespace stagecraft::rt::cpu {
namespace {

using namespace eltwise;

// Selu's defaults: ONNX's (float32 roundings of the constants of Klambauer et al. 2017).
constexpr float kSeluAlpha = 1.67326319217681884765625f;
constexpr float kSeluGamma = 1.05070102214813232421875f;

// ---------------------------------------------------------------------------------------------
// Forward

void run_elu(const KernelArgs& a) {
  const double alpha = a.attrs.f("alpha", 1.0f);
  float_unary<dnnl::algorithm::eltwise_elu>(
      a, [=](double v) { return v > 0 ? v : alpha * std::expm1(v); }, static_cast<float>(alpha));
}

// Celu: max(0, x) + min(0, alpha (e^(x / alpha) - 1)) (alpha default 1), nn.CELU.
void run_celu(const KernelArgs& a) {
  const double alpha = a.attrs.f("alpha", 1.0f);
  const Tensor& x = unary_input(a);
  if (x.dtype == DType::kFloat32)
    return map(x.as<float>(), a.out[0]->as<float>(), x.numel(), [=](float v) {
      return v > 0 ? v : static_cast<float>(alpha * std::expm1(static_cast<double>(v) / alpha));
    });
  map(x.as<double>(), a.out[0]->as<double>(), x.numel(),
      [=](double v) { return v > 0 ? v : alpha * std::expm1(v / alpha); });
}

template <class T>
T selu(T v, T alpha, T gamma) {
  return gamma * (v > T(0) ? v : alpha * std::expm1(v));
}

void run_selu(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  const float alpha = a.attrs.f("alpha", kSeluAlpha), gamma = a.attrs.f("gamma", kSeluGamma);
  if (x.dtype == DType::kFloat32)
    return map(x.as<float>(), a.out[0]->as<float>(), x.numel(),
               [=](float v) { return selu(v, alpha, gamma); });
  map(x.as<double>(), a.out[0]->as<double>(), x.numel(),
      [=](double v) { return selu<double>(v, alpha, gamma); });
}

// log(1 + e^x), written so that neither a large x (e^x overflows) nor a very negative one
// (1 + e^x rounds to 1) loses the result.
void run_softplus(const KernelArgs& a) {
  float_unary<dnnl::algorithm::eltwise_soft_relu>(
      a, [](double v) { return v > 0 ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v)); });
}

// Y = X where X > 0, slope * X elsewhere; the slope broadcasts to X (unidirectionally).
void run_prelu(const KernelArgs& a) {
  const Tensor &x = a.input(0), &slope = a.input(1);
  if (ops::broadcast_shape(x.shape, slope.shape) != x.shape)
    fail(ErrorKind::kShape, "PRelu '{}': the slope {} does not broadcast to X {}", a.name,
         shape_string(slope.shape), shape_string(x.shape));
  Broadcast<2> plan = broadcast_output<2>(a);
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_floating_point_v<T>)
      binary_loop(plan, x.as<T>(), slope.as<T>(), a.out[0]->as<T>(),
                  [](T v, T s) { return v > T(0) ? v : s * v; });
  });
}

/// Whether a Gelu's `approximate` is "tanh"; fails for anything but "none" and "tanh".
bool gelu_tanh(const KernelArgs& a) {
  const std::string approximate = a.attrs.s("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    fail(ErrorKind::kUnsupported, "{} '{}': approximate='{}' (\"none\" or \"tanh\")", a.op_type,
         a.name, approximate);
  return approximate == "tanh";
}

void run_gelu(const KernelArgs& a) {
  if (gelu_tanh(a))
    return float_unary<dnnl::algorithm::eltwise_gelu_tanh>(
        a, [](double v) { return ops::gelu_tanh(v); });
  float_unary<dnnl::algorithm::eltwise_gelu_erf>(a, [](double v) { return ops::gelu(v); });
}

std::string check_gelu(const OpSignature& s) {
  const std::string approximate = s.attrs.s("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    return fmt::format("Gelu with approximate='{}' is not supported (\"none\" or \"tanh\")",
                       approximate);
  return check_float_unary(s);
}

std::string check_prelu(const OpSignature& s) {
  if (auto why = arity(s, 2, 2, 1); !why.empty()) return why;
  if (!is_float(s.inputs[0]))
    return fmt::format("PRelu on {} is not supported (float32 and float64 only)",
                       dtype_name(s.inputs[0]));
  if (s.inputs[1] != s.inputs[0])
    return fmt::format("PRelu of {} with a {} slope is not a valid signature",
                       dtype_name(s.inputs[0]), dtype_name(s.inputs[1]));
  return same_output(s);
}

// ---------------------------------------------------------------------------------------------
// Gradients

void elu_grad(const KernelArgs& a) {
  const float alpha = a.attrs.f("alpha", 1.0f);
  unary_grad(
      a, [](float x) { return x; },
      [=](float x, float, float dy) { return x > 0 ? dy : dy * alpha * std::exp(x); });
}

void celu_grad(const KernelArgs& a) {
  const float alpha = a.attrs.f("alpha", 1.0f);
  unary_grad(
      a, [](float x) { return x; },
      [=](float x, float, float dy) { return x > 0 ? dy : dy * std::exp(x / alpha); });
}

void selu_grad(const KernelArgs& a) {
  const float alpha = a.attrs.f("alpha", kSeluAlpha), gamma = a.attrs.f("gamma", kSeluGamma);
  unary_grad(
      a, [](float x) { return x; },
      [=](float x, float, float dy) {
        return x > 0 ? gamma * dy : gamma * alpha * dy * std::exp(x);
      });
}

// d softplus / dx = sigmoid(x).
void softplus_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; },
      [](float x, float, float dy) { return dy / (1 + std::exp(-x)); });
}

void prelu_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  if (b.dy->shape != b.lhs->shape)
    fail(ErrorKind::kShape, "PReluGrad '{}': the slope {} does not broadcast to X {}", a.name,
         shape_string(b.rhs->shape), shape_string(b.lhs->shape));
  if (io.dx(0) != nullptr)
    binary_part(a, 0, *b.lhs, *b.rhs, nullptr, *b.dy,
                [](float x, float slope, float, float d) { return x > 0 ? d : slope * d; });
  if (io.dx(1) != nullptr)
    binary_part(a, 1, *b.lhs, *b.rhs, nullptr, *b.dy,
                [](float x, float, float, float d) { return x > 0 ? 0.0f : x * d; });
}

// dx = dy * gelu'(x) by oneDNN's eltwise backward primitive (its own vectorised erf or tanh,
// as the forward's): glibc's erff and expf, a call each per element, made the plain loop below
// 12x the forward (GPT-style training, [8, 128, 1024] a call: 5.9 ms against 0.5). False where
// the node's operands are not the plain case (dX and dY of X's shape), which the loop takes.
bool gelu_grad_dnnl(const KernelArgs& a, bool tanh) {
  const ops::GradIo io(a);
  Tensor* dx = io.dx(0);
  const Tensor* dy = io.dy(0);
  if (io.n != 1 || dx == nullptr || dy == nullptr) return false;
  const Tensor& x = io.need_x(0);
  if (x.dtype != DType::kFloat32 || dy->dtype != DType::kFloat32 || dx->shape != x.shape ||
      dy->shape != x.shape || x.numel() == 0)
    return false;
  CpuContext& ctx = context(a);
  const dnnl::algorithm algorithm =
      tanh ? dnnl::algorithm::eltwise_gelu_tanh : dnnl::algorithm::eltwise_gelu_erf;
  const dnnl::memory::desc md = plain_desc({x.numel()});
  const dnnl::eltwise_forward::primitive_desc hint(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, algorithm, md), ctx.engine);
  const dnnl::eltwise_backward::primitive_desc pd(dnnl::eltwise_backward::desc(algorithm, md, md),
                                                  ctx.engine, hint);
  dnnl::memory src(md, ctx.engine, const_cast<std::byte*>(x.data));
  dnnl::memory diff_dst(md, ctx.engine, const_cast<std::byte*>(dy->data));
  dnnl::memory diff_src(md, ctx.engine, dx->data);
  dnnl::eltwise_backward(pd).execute(
      ctx.stream,
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}});
  ctx.stream.wait();
  return true;
}

// The output y is not read (nor recomputed): the derivative is a function of x alone.
void gelu_grad(const KernelArgs& a) {
  if (gelu_grad_dnnl(a, gelu_tanh(a))) return;
  if (gelu_tanh(a))
    return unary_grad(
        a, [](float) { return 0.0f; },
        [](float x, float, float dy) { return dy * ops::gelu_tanh_derivative(x); });
  unary_grad(
      a, [](float) { return 0.0f; },
      [](float x, float, float dy) { return dy * ops::gelu_derivative(x); });
}

std::string check_unary_grad(const OpSignature& s) { return check_float_grad(s, kUnaryArity); }
std::string check_binary_grad(const OpSignature& s) { return check_float_grad(s, kBinaryArity); }

// The gradients write every element of dx (summed back where the slope was broadcast), or zero
// it when dy is omitted.
constexpr KernelEntry kKernels[] = {
    {"Elu", run_elu, check_float_unary},
    {"Selu", run_selu, check_float_unary},
    {"Celu", run_celu, check_float_unary},
    {"Softplus", run_softplus, check_float_unary},
    {"PRelu", run_prelu, check_prelu},
    {"Gelu", run_gelu, check_gelu, /*writes_every_output=*/true},
    {"EluGrad", elu_grad, check_unary_grad, /*writes_every_output=*/true},
    {"SeluGrad", selu_grad, check_unary_grad, /*writes_every_output=*/true},
    {"CeluGrad", celu_grad, check_unary_grad, /*writes_every_output=*/true},
    {"SoftplusGrad", softplus_grad, check_unary_grad, /*writes_every_output=*/true},
    {"PReluGrad", prelu_grad, check_binary_grad, /*writes_every_output=*/true},
    {"GeluGrad", gelu_grad, check_unary_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> activations_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
