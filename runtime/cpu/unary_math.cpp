// Unary maths of issue 15 and their gradients (see families.h): Exp, Log, Neg, Abs, Ceil,
// Floor, Reciprocal; Sin and Cos (sinusoidal position and timestep embeddings, rotary
// embeddings computed in the graph), Sign and Round (half to even, as ONNX and numpy). Float32 Exp,
// Log and Abs run as oneDNN eltwise primitives; the rest (Reciprocal a plain 1 / x, exact, where
// oneDNN's pow(x, -1) is not), float64 and the integers are plain C++ loops (Neg and Abs take the
// signed integers, Abs the unsigned ones too, as ONNX allows; integer negation wraps, so Neg and
// Abs of the lowest value give it back). Gradients are float32 (contract:
// runtime/format/grad_ops.h): dx = dy * y (Exp), dy / x (Log), -dy (Neg), dy * sign(x) (Abs, 0 at 0
// as PyTorch), -dy * y * y (Reciprocal), dy * cos(x) (Sin), -dy * sin(x) (Cos), and 0 for Ceil,
// Floor, Sign and Round (piecewise constant: their gradient is zero wherever it exists, as
// PyTorch's).
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/grad_eltwise_common.h"

namespace stagecraft::rt::cpu {
namespace {

using namespace eltwise;

// ---------------------------------------------------------------------------------------------
// Forward

void run_exp(const KernelArgs& a) {
  float_unary<dnnl::algorithm::eltwise_exp>(a, [](double v) { return std::exp(v); });
}

void run_log(const KernelArgs& a) {
  float_unary<dnnl::algorithm::eltwise_log>(a, [](double v) { return std::log(v); });
}

// -x; integers in their unsigned type, so the lowest value wraps to itself.
template <class T>
T negate(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return -v;
  else
    return static_cast<T>(Wrap<T>(0) - Wrap<T>(v));
}

void run_neg(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_signed_v<T>)
      map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [](T v) { return negate(v); });
  });
}

void run_abs(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  if (x.dtype == DType::kFloat32) return dnnl_eltwise(a, x, dnnl::algorithm::eltwise_abs);
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_unsigned_v<T>)
      map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [](T v) { return v; });
    else if constexpr (std::is_floating_point_v<T>)
      map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [](T v) { return std::fabs(v); });
    else
      map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [](T v) { return v < T(0) ? negate(v) : v; });
  });
}

// Ceil and Floor: oneDNN has no such eltwise algorithm (only round to nearest even).
template <bool kCeil>
void run_round(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_floating_point_v<T>)
      map(x.as<T>(), a.out[0]->as<T>(), x.numel(),
          [](T v) { return kCeil ? std::ceil(v) : std::floor(v); });
  });
}

void run_reciprocal(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_floating_point_v<T>)
      map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [](T v) { return T(1) / v; });
  });
}

// f of each float32 or float64 element (Sin, Cos, Sign, Round: oneDNN has no such eltwise
// algorithm), computed in the element's own type.
template <class F>
void float_map(const KernelArgs& a, F f) {
  const Tensor& x = unary_input(a);
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_floating_point_v<T>)
      map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [&](T v) { return f(v); });
  });
}

void run_sin(const KernelArgs& a) {
  float_map(a, [](auto v) { return std::sin(v); });
}

void run_cos(const KernelArgs& a) {
  float_map(a, [](auto v) { return std::cos(v); });
}

// -1, 0 or 1; NaN stays NaN (numpy's sign).
void run_sign(const KernelArgs& a) {
  float_map(a, [](auto v) {
    using T = decltype(v);
    return v > T(0) ? T(1) : (v < T(0) ? T(-1) : v * T(0));
  });
}

// To the nearest integer, halves to even (the default rounding mode's nearbyint).
void run_round_even(const KernelArgs& a) {
  float_map(a, [](auto v) { return std::nearbyint(v); });
}

std::string check_neg(const OpSignature& s) {
  if (auto why = arity(s, 1, 1, 1); !why.empty()) return why;
  if (!is_float(s.inputs[0]) && !is_signed_integer(s.inputs[0]))
    return fmt::format("Neg on {} is not supported (float32, float64 and signed integers only)",
                       dtype_name(s.inputs[0]));
  return same_output(s);
}

std::string check_abs(const OpSignature& s) {
  if (auto why = arity(s, 1, 1, 1); !why.empty()) return why;
  if (!is_numeric(s.inputs[0]))
    return fmt::format("Abs on {} is not supported (float32, float64 and integers only)",
                       dtype_name(s.inputs[0]));
  return same_output(s);
}

// ---------------------------------------------------------------------------------------------
// Gradients

void exp_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return std::exp(x); }, [](float, float y, float dy) { return dy * y; });
}

void log_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; }, [](float x, float, float dy) { return dy / x; });
}

void neg_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; }, [](float, float, float dy) { return -dy; });
}

void abs_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; },
      [](float x, float, float dy) { return x > 0 ? dy : (x < 0 ? -dy : 0.0f); });
}

void reciprocal_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return 1.0f / x; }, [](float, float y, float dy) { return -dy * y * y; });
}

void sin_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; }, [](float x, float, float dy) { return dy * std::cos(x); });
}

void cos_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; }, [](float x, float, float dy) { return -dy * std::sin(x); });
}

// Ceil, Floor, Sign and Round: zero wherever the gradient exists (everywhere but their steps).
void round_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; }, [](float, float, float) { return 0.0f; });
}

std::string check_unary_grad(const OpSignature& s) { return check_float_grad(s, kUnaryArity); }

// The gradients write every element of dx (or zero it when dy is omitted).
constexpr KernelEntry kKernels[] = {
    {"Exp", run_exp, check_float_unary},
    {"Log", run_log, check_float_unary},
    {"Neg", run_neg, check_neg},
    {"Abs", run_abs, check_abs},
    {"Ceil", run_round<true>, check_float_unary},
    {"Floor", run_round<false>, check_float_unary},
    {"Reciprocal", run_reciprocal, check_float_unary},
    {"Sin", run_sin, check_float_unary},
    {"Cos", run_cos, check_float_unary},
    {"Sign", run_sign, check_float_unary},
    {"Round", run_round_even, check_float_unary},
    {"ExpGrad", exp_grad, check_unary_grad, /*writes_every_output=*/true},
    {"LogGrad", log_grad, check_unary_grad, /*writes_every_output=*/true},
    {"NegGrad", neg_grad, check_unary_grad, /*writes_every_output=*/true},
    {"AbsGrad", abs_grad, check_unary_grad, /*writes_every_output=*/true},
    {"CeilGrad", round_grad, check_unary_grad, /*writes_every_output=*/true},
    {"FloorGrad", round_grad, check_unary_grad, /*writes_every_output=*/true},
    {"ReciprocalGrad", reciprocal_grad, check_unary_grad, /*writes_every_output=*/true},
    {"SinGrad", sin_grad, check_unary_grad, /*writes_every_output=*/true},
    {"CosGrad", cos_grad, check_unary_grad, /*writes_every_output=*/true},
    {"SignGrad", round_grad, check_unary_grad, /*writes_every_output=*/true},
    {"RoundGrad", round_grad, check_unary_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> unary_math_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
