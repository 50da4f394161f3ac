// Comparisons, logic, Min, Max and Mod (see families.h), all with numpy broadcasting: Greater,
// Less, GreaterOrEqual and LessOrEqual (numeric inputs of one type, a bool output; false on
// NaN, runtime/ops/compare_element.h), Not, And and Or (bools), IsNaN and IsInf (float32 or
// float64 to bools; IsInf's detect_positive and detect_negative), Min and Max
// (one or more numeric inputs; NaN propagates, as numpy's minimum and maximum), Mod (numeric:
// fmod=0 takes the divisor's sign, as Python's %, fmod=1 the dividend's, as C's fmod; floats
// must set fmod=1, as ONNX says; an integer zero divisor is refused, the lowest value mod -1 is
// 0). Loops are plain C++ through the broadcasting loop of eltwise_common.h (oneDNN's binary
// primitive has min, max, gt and lt, but only on float32, int8 and uint8 and without bools).
//
// Gradients (float32; contract: runtime/format/grad_ops.h): Min and Max send dy to the inputs
// equal to the output, split evenly between ties (PyTorch's maximum and minimum give each of two
// equal inputs half); float Mod sends dy to the dividend and -dy * trunc(a / b) to the divisor
// (PyTorch's fmod). The comparisons and logic ops have none (ops.def: kNoGradient). Every input
// broadcast is summed back to its shape.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/grad_eltwise_common.h"
#include "runtime/ops/compare_element.h"

namespace stagecraft::rt::cpu {
namespace {

using namespace eltwise;
using ops::compare;
using ops::Comparison;

// ---------------------------------------------------------------------------------------------
// Comparisons and logic

template <Comparison kWhich>
void run_compare(const KernelArgs& a) {
  Broadcast<2> plan = broadcast_output<2>(a);
  const Tensor &x = a.input(0), &y = a.input(1);
  uint8_t* z = a.out[0]->as<uint8_t>();
  visit(x.dtype, [&]<class T>(Type<T>) {
    binary_loop(plan, x.as<T>(), y.as<T>(), z,
                [](T u, T v) { return static_cast<uint8_t>(compare<kWhich>(u, v)); });
  });
}

void run_not(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  map(x.as<uint8_t>(), a.out[0]->as<uint8_t>(), x.numel(),
      [](uint8_t v) { return static_cast<uint8_t>(v == 0); });
}

// IsNaN; IsInf with detect_positive and detect_negative (default 1 each). Float32 and float64.
template <bool kNan>
void run_is_special(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  const bool pos = a.attrs.i("detect_positive", 1) != 0, neg = a.attrs.i("detect_negative", 1) != 0;
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_floating_point_v<T>)
      map(x.as<T>(), a.out[0]->as<uint8_t>(), x.numel(), [=](T v) {
        if (kNan) return static_cast<uint8_t>(v != v);
        return static_cast<uint8_t>((pos && std::isinf(v) && v > 0) ||
                                    (neg && std::isinf(v) && v < 0));
      });
  });
}

template <bool kAnd>
void run_logic(const KernelArgs& a) {
  Broadcast<2> plan = broadcast_output<2>(a);
  binary_loop(plan, a.input(0).as<uint8_t>(), a.input(1).as<uint8_t>(), a.out[0]->as<uint8_t>(),
              [](uint8_t u, uint8_t v) {
                return static_cast<uint8_t>(kAnd ? (u != 0) && (v != 0) : (u != 0) || (v != 0));
              });
}

// ---------------------------------------------------------------------------------------------
// Min and Max

// The larger (kMax) or smaller of u and v; NaN when either is.
template <bool kMax, class T>
T pick(T u, T v) {
  if constexpr (std::is_floating_point_v<T>)
    if (u != u) return u;
  return (kMax ? u > v : u < v) ? u : v;
}

// The shape every input of a variadic op broadcasts to.
Shape broadcast_all(const KernelArgs& a) {
  Shape out = a.input(0).shape;
  for (size_t k = 1; k < a.num_inputs(); ++k) out = ops::broadcast_shape(out, a.input(k).shape);
  return out;
}

// z = the elementwise Min or Max of every input, broadcast to z's shape: the first two inputs
// (or the one, with itself), then each further input folded into z.
template <bool kMax, class T>
void min_max_into(const KernelArgs& a, T* z, const Shape& out) {
  auto f = [](T u, T v) { return pick<kMax>(u, v); };
  const Tensor& first = a.input(0);
  const Tensor& second = a.num_inputs() > 1 ? a.input(1) : first;
  binary_loop(Broadcast<2>({first.shape, second.shape}, out), first.as<T>(), second.as<T>(), z, f);
  for (size_t k = 2; k < a.num_inputs(); ++k) {
    const Tensor& next = a.input(k);
    binary_loop(Broadcast<2>({out, next.shape}, out), z, next.as<T>(), z, f);
  }
}

template <bool kMax>
void run_min_max(const KernelArgs& a) {
  const Shape out = broadcast_all(a);
  expect_shape(a, 0, out);
  visit(a.input(0).dtype,
        [&]<class T>(Type<T>) { min_max_into<kMax, T>(a, a.out[0]->as<T>(), out); });
}

// ---------------------------------------------------------------------------------------------
// Mod

// x mod y: fmod=1 truncated (the dividend's sign), fmod=0 floored (the divisor's sign); the
// kernel has refused integer zero divisors.
template <bool kFmod, class T>
T mod(T x, T y) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::fmod(x, y);  // the check requires fmod=1 for floats
  } else if constexpr (std::is_unsigned_v<T>) {
    return static_cast<T>(x % y);
  } else {
    if (y == T(-1)) return T(0);  // no INT_MIN % -1 trap
    const T r = static_cast<T>(x % y);
    if constexpr (kFmod) return r;
    return r != T(0) && ((r < T(0)) != (y < T(0))) ? static_cast<T>(r + y) : r;
  }
}

void run_mod(const KernelArgs& a) {
  Broadcast<2> plan = broadcast_output<2>(a);
  const Tensor &x = a.input(0), &y = a.input(1);
  const bool fmod = a.attrs.i("fmod", 0) != 0;
  visit(x.dtype, [&]<class T>(Type<T>) {
    if constexpr (std::is_integral_v<T>) {
      const T* d = y.as<T>();
      if (std::find(d, d + y.numel(), T(0)) != d + y.numel())
        fail(ErrorKind::kModel, "Mod '{}': integer modulo by zero ({} divisor)", a.name,
             dtype_name(y.dtype));
    }
    if (fmod)
      binary_loop(plan, x.as<T>(), y.as<T>(), a.out[0]->as<T>(),
                  [](T u, T v) { return mod<true, T>(u, v); });
    else
      binary_loop(plan, x.as<T>(), y.as<T>(), a.out[0]->as<T>(),
                  [](T u, T v) { return mod<false, T>(u, v); });
  });
}

// ---------------------------------------------------------------------------------------------
// Checks

// Two inputs of one numeric type (`bools`: of bool) and an output of `out` (kUndefined: the
// inputs' type).
std::string check_binary(const OpSignature& s, bool bools, DType out) {
  if (auto why = arity(s, 2, 2, 1); !why.empty()) return why;
  const DType d = s.inputs[0];
  if (bools ? d != DType::kBool : !is_numeric(d))
    return fmt::format("{} on {} is not supported ({})", s.op_type, dtype_name(d),
                       bools ? "bool only" : "float32, float64 and integers only");
  const DType want = out == DType::kUndefined ? d : out;
  if (s.inputs[1] != d || s.outputs[0] != want)
    return fmt::format("{} of {} and {} giving {} is not a valid signature", s.op_type,
                       dtype_name(d), dtype_name(s.inputs[1]), dtype_name(s.outputs[0]));
  return "";
}

std::string check_compare(const OpSignature& s) { return check_binary(s, false, DType::kBool); }
std::string check_logic(const OpSignature& s) { return check_binary(s, true, DType::kBool); }

std::string check_not(const OpSignature& s) {
  if (auto why = arity(s, 1, 1, 1); !why.empty()) return why;
  if (s.inputs[0] != DType::kBool || s.outputs[0] != DType::kBool)
    return fmt::format("Not of {} giving {} is not a valid signature (bool only)",
                       dtype_name(s.inputs[0]), dtype_name(s.outputs[0]));
  return "";
}

std::string check_is_special(const OpSignature& s) {
  if (auto why = arity(s, 1, 1, 1); !why.empty()) return why;
  if (!is_float(s.inputs[0]) || s.outputs[0] != DType::kBool)
    return fmt::format("{} of {} giving {} is not supported (float32 or float64 to bool)",
                       s.op_type, dtype_name(s.inputs[0]), dtype_name(s.outputs[0]));
  return "";
}

std::string check_min_max(const OpSignature& s) {
  if (s.inputs.empty() || s.outputs.size() != 1)
    return fmt::format("{} with {} inputs and {} outputs is not a valid signature", s.op_type,
                       s.inputs.size(), s.outputs.size());
  const DType d = s.inputs[0];
  if (!is_numeric(d))
    return fmt::format("{} on {} is not supported (float32, float64 and integers only)", s.op_type,
                       dtype_name(d));
  for (DType in : s.inputs)
    if (in != d)
      return fmt::format("{} of {} and {} is not a valid signature", s.op_type, dtype_name(d),
                         dtype_name(in));
  return same_output(s);
}

std::string check_mod(const OpSignature& s) {
  if (auto why = check_binary(s, false, DType::kUndefined); !why.empty()) return why;
  if (is_float(s.inputs[0]) && s.attrs.i("fmod", 0) == 0)
    return fmt::format("Mod on {} needs fmod=1 (ONNX: a floating-point Mod is C's fmod)",
                       dtype_name(s.inputs[0]));
  return "";
}

// ---------------------------------------------------------------------------------------------
// Gradients

// Calls f(output index, element of x) for every element of the dense `out` that x broadcasts to.
template <class F>
void along(const Tensor& x, const Shape& out, F f) {
  Broadcast<2> plan({x.shape, out}, out);
  const float* xs = x.as<float>();
  const int64_t step = plan.step(0);
  plan.for_each_run([&](int64_t o, const std::array<int64_t, 2>& in, int64_t count) {
    for (int64_t i = 0; i < count; ++i) f(o + i, xs[in[0] + i * step]);
  });
}

// dx_k = dy / ties where input k (broadcast) equals the output y, 0 elsewhere, summed back to
// input k's shape; ties counts the inputs equal to y at each element (0 only where y is NaN).
template <bool kMax>
void min_max_grad(const KernelArgs& a) {
  ops::GradIo io(a, {.n_min = 1, .n_max = ops::GradArity::kAny, .m_min = 1, .m_max = 1});
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return ops::zero_outputs(a);
  Shape out = io.need_x(0).shape;
  for (size_t k = 1; k < io.n; ++k) out = ops::broadcast_shape(out, io.need_x(k).shape);
  ops::expect_dy_shape(a, *dy, out);
  const auto n = static_cast<size_t>(shape_numel(out));
  // The forward output: given, or recomputed by the forward kernel's loops.
  std::vector<float> recomputed;
  const float* y = nullptr;
  if (const Tensor* given = io.y(0); given != nullptr && given->shape == out) {
    y = given->as<float>();
  } else {
    recomputed.resize(n);
    const KernelArgs forward{a.name, a.op_type, a.attrs, a.in.first(io.n), {}, a.device};
    min_max_into<kMax, float>(forward, recomputed.data(), out);
    y = recomputed.data();
  }
  std::vector<float> ties(n, 0.0f), full;
  for (size_t k = 0; k < io.n; ++k)
    along(io.need_x(k), out, [&](int64_t i, float v) { ties[i] += v == y[i] ? 1.0f : 0.0f; });
  const float* d = dy->as<float>();
  for (size_t k = 0; k < io.n; ++k) {
    Tensor* dx = io.dx(k);
    if (dx == nullptr) continue;
    const Tensor& x = io.need_x(k);
    expect_dx_shape(a, k, x.shape);
    const bool direct = x.shape == out;
    full.assign(direct ? 0 : n, 0.0f);
    float* dst = direct ? dx->as<float>() : full.data();
    along(x, out, [&](int64_t i, float v) { dst[i] = v == y[i] ? d[i] / ties[i] : 0.0f; });
    if (!direct) sum_to_shape(full.data(), out, dx->as<float>(), x.shape);
  }
}

// Mod on floats (fmod=1): d/da = 1, d/db = -trunc(a / b).
void mod_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  if (io.dx(0) != nullptr)
    binary_part(a, 0, *b.lhs, *b.rhs, nullptr, *b.dy,
                [](float, float, float, float d) { return d; });
  if (io.dx(1) != nullptr)
    binary_part(a, 1, *b.lhs, *b.rhs, nullptr, *b.dy,
                [](float u, float v, float, float d) { return -d * std::trunc(u / v); });
}

std::string check_min_max_grad(const OpSignature& s) {
  return check_float_grad(s, {.n_min = 1, .n_max = ops::GradArity::kAny, .m_min = 1, .m_max = 1});
}

std::string check_mod_grad(const OpSignature& s) {
  if (auto why = check_float_grad(s, kBinaryArity); !why.empty()) return why;
  if (s.attrs.i("fmod", 0) == 0) return "ModGrad on float32 needs fmod=1";
  return "";
}

// The gradients write every element of the outputs they are given (summed back where an input
// was broadcast), or zero them when dy is omitted.
constexpr KernelEntry kKernels[] = {
    {"Greater", run_compare<Comparison::kGreater>, check_compare},
    {"Less", run_compare<Comparison::kLess>, check_compare},
    {"GreaterOrEqual", run_compare<Comparison::kGreaterOrEqual>, check_compare},
    {"LessOrEqual", run_compare<Comparison::kLessOrEqual>, check_compare},
    {"Not", run_not, check_not},
    {"IsNaN", run_is_special<true>, check_is_special},
    {"IsInf", run_is_special<false>, check_is_special},
    {"And", run_logic<true>, check_logic},
    {"Or", run_logic<false>, check_logic},
    {"Min", run_min_max<false>, check_min_max},
    {"Max", run_min_max<true>, check_min_max},
    {"Mod", run_mod, check_mod},
    {"MinGrad", min_max_grad<false>, check_min_max_grad, /*writes_every_output=*/true},
    {"MaxGrad", min_max_grad<true>, check_min_max_grad, /*writes_every_output=*/true},
    {"ModGrad", mod_grad, check_mod_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> compare_logic_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
