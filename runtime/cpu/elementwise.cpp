// Kernels of the elementwise family (see families.h): unary maths (Relu, Sigmoid, Tanh, Sqrt,
// Erf, HardSigmoid, HardSwish, Clip), Dropout (in training mode: dropout_mask.h), Cast, the binary
// ops with numpy broadcasting (Add, Sub, Mul, Div, Pow, Equal) and Where.
//
// Loops are plain C++ over typed pointers, vectorised with `omp simd` and split among the
// worker's threads for large tensors: on these memory-bound ops that is as fast as oneDNN's
// binary primitive, and it broadcasts any way and takes every dtype. Float32 Sigmoid, Tanh, Sqrt
// and HardSwish run as oneDNN eltwise primitives (JIT-vectorised), float32 Erf as a rational
// approximation. Integer arithmetic wraps (two's complement) instead of overflowing, integer Div
// truncates toward zero and refuses a zero divisor, and float-to-integer conversions saturate
// (NaN gives 0), so no input makes a kernel undefined. Cast also converts float16 and bfloat16
// (rounding to nearest even); the other ops take float32, float64 and, where ONNX allows them,
// integers.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/dropout_mask.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/pow_element.h"

namespace stagecraft::rt::cpu {

namespace {

using namespace eltwise;  // convert: one element as Cast converts it (eltwise_common.h)

// ---------------------------------------------------------------------------------------------
// Unary ops

void run_sigmoid(const KernelArgs& a) {
  float_unary<dnnl::algorithm::eltwise_logistic>(a,
                                                 [](double v) { return 1 / (1 + std::exp(-v)); });
}

void run_tanh(const KernelArgs& a) {
  float_unary<dnnl::algorithm::eltwise_tanh>(a, [](double v) { return std::tanh(v); });
}

void run_sqrt(const KernelArgs& a) {
  float_unary<dnnl::algorithm::eltwise_sqrt>(a, [](double v) { return std::sqrt(v); });
}

// erf in float32 as a rational approximation on [-4, 4] (beyond, erf is +-1 in float32): odd
// degree-13 numerator over even degree-8 denominator, the coefficients of Eigen's and XLA's
// float erf; within 5e-7 of erf everywhere. The clamp to [-4, 4] works on the bits (an integer
// select, which GCC vectorises where a float compare that may trap is not) and keeps NaN.
float erf_float(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x), four = 0x40800000u, inf = 0x7f800000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  magnitude = magnitude > four && magnitude <= inf ? four : magnitude;
  x = std::bit_cast<float>(magnitude | (bits & 0x80000000u));
  const float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = x2 * -1.45660718464996e-05f - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return x * p / q;
}

void run_erf(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  if (x.dtype == DType::kFloat32)
    return map(x.as<float>(), a.out[0]->as<float>(), x.numel(),
               [](float v) { return erf_float(v); });
  map(x.as<double>(), a.out[0]->as<double>(), x.numel(), [](double v) { return std::erf(v); });
}

// max(0, min(1, alpha * x + beta)), written so that NaN propagates.
template <class T>
T hard_sigmoid(T x, T alpha, T beta) {
  T v = alpha * x + beta;
  v = v < T(0) ? T(0) : v;
  return v > T(1) ? T(1) : v;
}

void run_hard_sigmoid(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  const float alpha = a.attrs.f("alpha", 0.2f), beta = a.attrs.f("beta", 0.5f);
  if (x.dtype == DType::kFloat32)
    return map(x.as<float>(), a.out[0]->as<float>(), x.numel(),
               [=](float v) { return hard_sigmoid(v, alpha, beta); });
  map(x.as<double>(), a.out[0]->as<double>(), x.numel(),
      [=](double v) { return hard_sigmoid<double>(v, alpha, beta); });
}

// x * HardSigmoid(x) with alpha 1/6 and beta 1/2 (oneDNN's hardswish is the same function).
void run_hard_swish(const KernelArgs& a) {
  float_unary<dnnl::algorithm::eltwise_hardswish>(
      a, [](double v) { return v * hard_sigmoid(v, 1.0 / 6, 0.5); });
}

void run_relu(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  visit(x.dtype, [&]<class T>(Type<T>) {
    map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [](T v) { return v < T(0) ? T(0) : v; });
  });
}

// The one value of Clip's optional bound input k, or `fallback` when it is omitted.
template <class T>
T clip_bound(const KernelArgs& a, size_t k, T fallback) {
  if (!a.has_input(k)) return fallback;
  const Tensor& t = a.input(k);
  if (t.numel() != 1)
    fail(ErrorKind::kShape, "Clip's {} must be a scalar, not {}", k == 1 ? "min" : "max",
         shape_string(t.shape));
  return t.as<T>()[0];
}

// Clip: min and max are attributes up to opset 6 and optional inputs from opset 11.
void run_clip(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  visit(x.dtype, [&]<class T>(Type<T>) {
    T lo = a.attrs.has("min") ? convert<T>(a.attrs.f("min", 0))
                              : clip_bound<T>(a, 1, std::numeric_limits<T>::lowest());
    T hi = a.attrs.has("max") ? convert<T>(a.attrs.f("max", 0))
                              : clip_bound<T>(a, 2, std::numeric_limits<T>::max());
    // min(max(x, lo), hi): NaN stays NaN, and lo > hi gives hi everywhere, as numpy.clip.
    map(x.as<T>(), a.out[0]->as<T>(), x.numel(), [=](T v) {
      v = v < lo ? lo : v;
      return v > hi ? hi : v;
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Dropout and Cast

// Dropout in training mode with a ratio r > 0: each element kept with probability 1 - r and
// scaled by 1 / (1 - r), the mask (output 1, bool) saying which. The mask is dropout_mask.h's:
// the same for a training step's microbatch on any device and when recomputed.
void dropout_training(const KernelArgs& a, const Tensor& x, float ratio) {
  Tensor* mask = a.out.size() > 1 ? a.out[1] : nullptr;
  if (mask != nullptr) expect_shape(a, 1, x.shape);
  ops::check_dropout_training(x, mask);
  const uint64_t key = ops::dropout_node_key(a.random_key, a.attrs.i("seed", 0));
  const float scale = 1.0f / (1.0f - ratio);
  const float* in = x.as<float>();
  float* out = a.out[0]->as<float>();
  uint8_t* keep = mask != nullptr ? mask->as<uint8_t>() : nullptr;
  const int64_t n = x.numel();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const bool kept = ops::dropout_keeps(key, i, ratio);
    out[i] = kept ? in[i] * scale : 0.0f;
    if (keep != nullptr) keep[i] = kept ? 1 : 0;
  }
}

// Dropout. Training mode (opset 12+ input 2 true) with a nonzero ratio (input 1, default 0.5):
// `dropout_training`. Otherwise (inference, or a ratio of 0) the output is the input and the
// optional mask keeps everything.
void run_dropout(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  if (a.has_input(2) && ops::scalar_is_nonzero(a.input(2), "training_mode")) {
    const float ratio = a.has_input(1) ? ops::dropout_ratio(a.input(1)) : 0.5f;
    if (ratio != 0) return dropout_training(a, x, ratio);
  }
  if (x.data != a.out[0]->data) std::memcpy(a.out[0]->data, x.data, static_cast<size_t>(x.bytes()));
  if (a.out.size() > 1 && a.out[1] != nullptr) {
    Tensor& mask = *a.out[1];
    expect_shape(a, 1, x.shape);
    int64_t n = mask.numel();
    switch (mask.dtype) {
      case DType::kBool:
        std::fill_n(mask.as<uint8_t>(), n, uint8_t{1});
        break;
      case DType::kFloat32:
        std::fill_n(mask.as<float>(), n, 1.0f);
        break;
      case DType::kFloat64:
        std::fill_n(mask.as<double>(), n, 1.0);
        break;
      default:
        fail(ErrorKind::kInternal, "Dropout mask of type {} reached the kernel",
             dtype_name(mask.dtype));
    }
  }
}

void run_cast(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  Tensor& y = *a.out[0];
  if (x.dtype == y.dtype) {
    if (x.data != y.data) std::memcpy(y.data, x.data, static_cast<size_t>(x.bytes()));
    return;
  }
  visit<true>(x.dtype, [&]<class From>(Type<From>) {
    visit<true>(y.dtype, [&]<class To>(Type<To>) {
      map(x.as<From>(), y.as<To>(), x.numel(), [](From v) { return convert<To>(v); });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Binary ops with broadcasting

// One element of Add, Sub, Mul or Div. Integers wrap; integer Div truncates toward zero (the
// kernel has refused zero divisors) and x / -1 is the wrapped negation (no INT_MIN / -1 trap).
template <Arith op, class T>
T arith(T x, T y) {
  if constexpr (std::is_floating_point_v<T>) {
    if constexpr (op == Arith::kAdd)
      return x + y;
    else if constexpr (op == Arith::kSub)
      return x - y;
    else if constexpr (op == Arith::kMul)
      return x * y;
    else
      return x / y;
  } else {
    using U = Wrap<T>;
    if constexpr (op == Arith::kAdd)
      return static_cast<T>(U(x) + U(y));
    else if constexpr (op == Arith::kSub)
      return static_cast<T>(U(x) - U(y));
    else if constexpr (op == Arith::kMul)
      return static_cast<T>(U(x) * U(y));
    else if constexpr (std::is_signed_v<T>)
      return y == T(-1) ? static_cast<T>(U(0) - U(x)) : static_cast<T>(x / y);
    else
      return x / y;
  }
}

template <Arith op>
void run_arith(const KernelArgs& a) {
  Broadcast<2> plan = broadcast_output<2>(a);
  const Tensor &x = a.input(0), &y = a.input(1);
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (op == Arith::kDiv && std::is_integral_v<T>) {
      const T* d = y.as<T>();
      if (std::find(d, d + y.numel(), T(0)) != d + y.numel())
        fail(ErrorKind::kModel, "integer division by zero ({} divisor)", dtype_name(y.dtype));
    }
    binary_loop(plan, x.as<T>(), y.as<T>(), a.out[0]->as<T>(),
                [](T u, T v) { return arith<op, T>(u, v); });
  });
}

// One element of Pow (opset 12+ lets base and exponent differ in type; the output is the
// base's type). Float bases use pow (float32 with float32 in single precision, every other
// mix in double); integer bases with integer exponents are exact.
template <class T, class E>
T power(T x, E e) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<E, float>)
    return std::pow(x, e);
  else if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(std::pow(double(x), double(e)));
  else if constexpr (std::is_floating_point_v<E>)
    return convert<T>(std::pow(double(x), double(e)));
  else
    return ops::int_pow(x, e);
}

void run_pow(const KernelArgs& a) {
  Broadcast<2> plan = broadcast_output<2>(a);
  const Tensor &x = a.input(0), &y = a.input(1);
  Tensor& z = *a.out[0];
  // x^2 and x^3 with a float32 scalar exponent (layer norms and GELU) as products.
  if (x.dtype == DType::kFloat32 && y.dtype == DType::kFloat32 && y.numel() == 1 &&
      (y.as<float>()[0] == 2.0f || y.as<float>()[0] == 3.0f)) {
    if (y.as<float>()[0] == 2.0f)
      binary_loop(plan, x.as<float>(), y.as<float>(), z.as<float>(),
                  [](float u, float) { return u * u; });
    else
      binary_loop(plan, x.as<float>(), y.as<float>(), z.as<float>(),
                  [](float u, float) { return u * u * u; });
    return;
  }
  visit(x.dtype, [&]<class T>(Type<T>) {
    constexpr bool base_ok =
        std::is_floating_point_v<T> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
    if constexpr (base_ok)
      visit(y.dtype, [&]<class E>(Type<E>) {
        binary_loop(plan, x.as<T>(), y.as<E>(), z.as<T>(),
                    [](T u, E v) { return power<T, E>(u, v); });
      });
  });
}

void run_equal(const KernelArgs& a) {
  Broadcast<2> plan = broadcast_output<2>(a);
  const Tensor &x = a.input(0), &y = a.input(1);
  uint8_t* z = a.out[0]->as<uint8_t>();
  visit<true>(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_same_v<T, BoolByte>)
      binary_loop(plan, x.as<uint8_t>(), y.as<uint8_t>(), z,
                  [](uint8_t u, uint8_t v) { return uint8_t((u != 0) == (v != 0)); });
    else if constexpr (std::is_arithmetic_v<T>)
      binary_loop(plan, x.as<T>(), y.as<T>(), z, [](T u, T v) { return uint8_t(u == v); });
  });
}

// Where: out = condition ? x : y, broadcasting all three; elements are copied as opaque
// words of the element's size, so every fixed-size dtype works. The choice is a bit select
// (both words loaded): with `?:` GCC loads only the chosen one, a branch that keeps the loop
// from vectorising.
template <class W>
inline W pick(uint8_t c, W x, W y) {
  const W m = W(0) - W(c != 0);
  return (x & m) | (y & ~m);
}

template <class W>
void where_loop(const Broadcast<3>& plan, const uint8_t* c, const W* x, const W* y, W* z) {
  const int64_t sc = plan.step(0), sx = plan.step(1), sy = plan.step(2);
  plan.for_each_run([&](int64_t o, const std::array<int64_t, 3>& in, int64_t n) {
    const uint8_t* cs = c + in[0];
    const W* xs = x + in[1];
    const W* ys = y + in[2];
    W* zs = z + o;
    if (sc && sx && sy) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) zs[i] = pick(cs[i], xs[i], ys[i]);
    } else if (sc && !sx && sy) {  // masked_fill's: Where(mask, fill, scores)
      const W xv = *xs;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) zs[i] = pick(cs[i], xv, ys[i]);
    } else if (sc && sx && !sy) {  // Where(mask, scores, fill)
      const W yv = *ys;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) zs[i] = pick(cs[i], xs[i], yv);
    } else {
      for (int64_t i = 0; i < n; ++i) zs[i] = cs[i * sc] ? xs[i * sx] : ys[i * sy];
    }
  });
}

void run_where(const KernelArgs& a) {
  Broadcast<3> plan = broadcast_output<3>(a);
  const uint8_t* c = a.input(0).as<uint8_t>();
  const Tensor &x = a.input(1), &y = a.input(2);
  Tensor& z = *a.out[0];
  switch (dtype_size(x.dtype)) {
    case 1:
      return where_loop(plan, c, x.as<uint8_t>(), y.as<uint8_t>(), z.as<uint8_t>());
    case 2:
      return where_loop(plan, c, x.as<uint16_t>(), y.as<uint16_t>(), z.as<uint16_t>());
    case 4:
      return where_loop(plan, c, x.as<uint32_t>(), y.as<uint32_t>(), z.as<uint32_t>());
    case 8:
      return where_loop(plan, c, x.as<uint64_t>(), y.as<uint64_t>(), z.as<uint64_t>());
    default:
      fail(ErrorKind::kInternal, "Where on {} reached the kernel", dtype_name(x.dtype));
  }
}

// ---------------------------------------------------------------------------------------------
// Checks

std::string check_relu(const OpSignature& s) {
  if (auto why = arity(s, 1, 1, 1); !why.empty()) return why;
  DType d = s.inputs[0];
  if (!is_float(d) && d != DType::kInt8 && d != DType::kInt16 && d != DType::kInt32 &&
      d != DType::kInt64)
    return fmt::format("Relu on {} is not supported (float32, float64 and signed integers only)",
                       dtype_name(d));
  return same_output(s);
}

std::string check_clip(const OpSignature& s) {
  if (auto why = arity(s, 1, 3, 1); !why.empty()) return why;
  if (!is_numeric(s.inputs[0]))
    return fmt::format("Clip on {} is not supported (float32, float64 and integers only)",
                       dtype_name(s.inputs[0]));
  for (size_t k = 1; k < s.inputs.size(); ++k)
    if (s.inputs[k] != DType::kUndefined && s.inputs[k] != s.inputs[0])
      return fmt::format("Clip of {} with a {} bound is not a valid signature",
                         dtype_name(s.inputs[0]), dtype_name(s.inputs[k]));
  if ((s.attrs.has("min") || s.attrs.has("max")) && !is_float(s.inputs[0]))
    return fmt::format("Clip with min/max attributes on {} is not supported",
                       dtype_name(s.inputs[0]));
  return same_output(s);
}

std::string check_dropout(const OpSignature& s) {
  if (s.inputs.empty() || s.inputs.size() > 3 || s.outputs.empty() || s.outputs.size() > 2)
    return "Dropout with this many inputs or outputs is not a valid signature";
  if (dtype_size(s.inputs[0]) <= 0)
    return fmt::format("Dropout on {} is not supported", dtype_name(s.inputs[0]));
  if (auto why = same_output(s); !why.empty()) return why;
  if (s.attrs.i("is_test", 1) == 0) return "Dropout with is_test=0 (training) is not supported";
  // A training_mode input may switch it on, and training-mode Dropout runs on float32: 16-bit
  // data then runs widened (Backend::runs_widened), its mask bool as it is.
  if (s.inputs.size() == 3 && s.inputs[2] != DType::kUndefined &&
      is_16bit_float(s.inputs[0]))
    return fmt::format("Dropout with a training_mode input on {} is not supported (float32 only)",
                       dtype_name(s.inputs[0]));
  if (s.outputs.size() == 2 && s.outputs[1] != DType::kUndefined && s.outputs[1] != DType::kBool &&
      !is_float(s.outputs[1]))
    return fmt::format("Dropout with a {} mask is not supported", dtype_name(s.outputs[1]));
  return "";
}

std::string check_cast(const OpSignature& s) {
  if (auto why = arity(s, 1, 1, 1); !why.empty()) return why;
  if (!s.attrs.has("to")) return "Cast needs attribute 'to'";
  auto to = dtype_from_onnx(static_cast<int32_t>(s.attrs.i("to", 0)));
  for (DType d : {s.inputs[0], to.value_or(DType::kUndefined)})
    if (!is_numeric(d) && d != DType::kBool && d != DType::kFloat16 && d != DType::kBFloat16)
      return fmt::format(
          "Cast from {} to {} is not supported (numeric types, bool, float16 and bfloat16 only)",
          dtype_name(s.inputs[0]), to ? dtype_name(*to) : "an unknown type");
  if (s.outputs[0] != *to)
    return fmt::format("Cast to {} with a {} output is not a valid signature", dtype_name(*to),
                       dtype_name(s.outputs[0]));
  return "";
}

// Add, Sub, Mul, Div: two inputs and the output of one numeric type.
std::string check_arith(const OpSignature& s) {
  if (auto why = arity(s, 2, 2, 1); !why.empty()) return why;
  if (!is_numeric(s.inputs[0]))
    return fmt::format("{} on {} is not supported (float32, float64 and integers only)", s.op_type,
                       dtype_name(s.inputs[0]));
  if (s.inputs[1] != s.inputs[0])
    return fmt::format("{} of {} and {} is not a valid signature", s.op_type,
                       dtype_name(s.inputs[0]), dtype_name(s.inputs[1]));
  return same_output(s);
}

std::string check_pow(const OpSignature& s) {
  if (auto why = arity(s, 2, 2, 1); !why.empty()) return why;
  DType base = s.inputs[0];
  if (!is_float(base) && base != DType::kInt32 && base != DType::kInt64)
    return fmt::format(
        "Pow with a {} base is not supported (float32, float64, int32 and int64 only)",
        dtype_name(base));
  if (!is_numeric(s.inputs[1]))
    return fmt::format("Pow with a {} exponent is not supported", dtype_name(s.inputs[1]));
  return same_output(s);
}

std::string check_equal(const OpSignature& s) {
  if (auto why = arity(s, 2, 2, 1); !why.empty()) return why;
  if (!is_numeric(s.inputs[0]) && s.inputs[0] != DType::kBool)
    return fmt::format("Equal on {} is not supported (numeric types and bool only)",
                       dtype_name(s.inputs[0]));
  if (s.inputs[1] != s.inputs[0] || s.outputs[0] != DType::kBool)
    return fmt::format("Equal of {} and {} giving {} is not a valid signature",
                       dtype_name(s.inputs[0]), dtype_name(s.inputs[1]), dtype_name(s.outputs[0]));
  return "";
}

std::string check_where(const OpSignature& s) {
  if (auto why = arity(s, 3, 3, 1); !why.empty()) return why;
  if (s.inputs[0] != DType::kBool)
    return fmt::format("Where with a {} condition is not a valid signature",
                       dtype_name(s.inputs[0]));
  DType d = s.inputs[1];
  int64_t size = dtype_size(d);
  if (size != 1 && size != 2 && size != 4 && size != 8)
    return fmt::format("Where on {} is not supported", dtype_name(d));
  if (s.inputs[2] != d || s.outputs[0] != d)
    return fmt::format("Where choosing between {} and {} giving {} is not a valid signature",
                       dtype_name(d), dtype_name(s.inputs[2]), dtype_name(s.outputs[0]));
  return "";
}

constexpr KernelEntry kKernels[] = {
    {"Relu", run_relu, check_relu},
    {"Sigmoid", run_sigmoid, check_float_unary},
    {"Tanh", run_tanh, check_float_unary},
    {"Sqrt", run_sqrt, check_float_unary},
    {"Erf", run_erf, check_float_unary},
    {"HardSigmoid", run_hard_sigmoid, check_float_unary},
    {"HardSwish", run_hard_swish, check_float_unary},
    {"Clip", run_clip, check_clip},
    {"Dropout", run_dropout, check_dropout},
    {"Cast", run_cast, check_cast},
    {"Add", run_arith<Arith::kAdd>, check_arith},
    {"Sub", run_arith<Arith::kSub>, check_arith},
    {"Mul", run_arith<Arith::kMul>, check_arith},
    {"Div", run_arith<Arith::kDiv>, check_arith},
    {"Pow", run_pow, check_pow},
    {"Equal", run_equal, check_equal},
    {"Where", run_where, check_where},
};

}  // namespace

std::span<const KernelEntry> elementwise_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
