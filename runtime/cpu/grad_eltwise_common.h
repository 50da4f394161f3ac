#pragma once
/// \file
/// What the CPU backend's elementwise gradient kernels share (grad_eltwise.cpp, unary_math.cpp,
/// activations.cpp, compare_logic.cpp): reading a gradient op's operands (contract:
/// runtime/format/grad_ops.h), the unary gradient loop, a binary op's gradient per output
/// element with broadcasting undone (`sum_to_shape`), and the float32 signature check.

#include <fmt/format.h>
#include <omp.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cpu/broadcast.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cpu::eltwise {

/// Gradient loops over at least this many elements use all of the worker's threads.
inline constexpr int64_t kGradParallelElements = int64_t{1} << 15;

/// Zeroes dx_k where it is wanted.
inline void zero_output(const ops::GradIo& io, size_t k) {
  if (Tensor* t = io.dx(k)) ops::zero(*t);
}

/// Fails unless `dx` has `shape` (the forward input's).
inline void expect_dx_shape(const KernelArgs& a, size_t k, const Shape& shape) {
  expect_shape(a, k, shape);
}

/// dx = g(x, y, dy) elementwise; y is the forward output, recomputed by `fwd(x)` when omitted.
template <class Fwd, class G>
void unary_grad(const KernelArgs& a, Fwd fwd, G g) {
  ops::GradIo io(a);
  for (size_t k = 1; k < io.n; ++k) zero_output(io, k);  // Clip's bounds get none
  Tensor* dx = io.dx(0);
  const Tensor* dy = io.dy(0);
  if (dx == nullptr) return;
  if (dy == nullptr) return ops::zero(*dx);
  const Tensor& x = io.need_x(0);
  expect_dx_shape(a, 0, x.shape);
  ops::expect_dy_shape(a, *dy, x.shape);
  const float* xs = x.as<float>();
  const float* dys = dy->as<float>();
  float* dxs = dx->as<float>();
  const int64_t n = x.numel();
  const Tensor* y = io.y(0);
  // A bare Y (grad_reads.h: the gradient is a function of X) is recomputed from X.
  if (y != nullptr && !y->is_bare() && y->shape == x.shape) {
    const float* ys = y->as<float>();
#pragma omp parallel for simd if (parallel : n >= kGradParallelElements)
    for (int64_t i = 0; i < n; ++i) dxs[i] = g(xs[i], ys[i], dys[i]);
  } else {
#pragma omp parallel for if (n >= kGradParallelElements)
    for (int64_t i = 0; i < n; ++i) dxs[i] = g(xs[i], fwd(xs[i]), dys[i]);
  }
}

/// dx_k = sum over broadcast dims of f(a, b, y, dy) evaluated at every output element, where a
/// and b are the forward inputs read with broadcasting and y, dy have the output's shape.
/// `y` may be null (then f gets 0 for it).
/// With `kReadsOperands` false (AddGrad, SubGrad: grad_reads.h), a and b are not read (f gets
/// 0 for them): the runtime hands such operands over bare, with their shapes and no bytes.
template <bool kReadsOperands = true, class F>
void binary_part(const KernelArgs& a, size_t k, const Tensor& lhs, const Tensor& rhs,
                 const Tensor* y, const Tensor& dy, F f) {
  Tensor& dx = *a.out[k];
  const Shape& out_shape = dy.shape;
  const Tensor& xk = k == 0 ? lhs : rhs;
  expect_dx_shape(a, k, xk.shape);
  Broadcast<2> plan({lhs.shape, rhs.shape}, out_shape);
  const bool direct = xk.shape == out_shape;
  std::vector<float> full;
  float* dst = dx.as<float>();
  if (!direct) {
    full.resize(static_cast<size_t>(shape_numel(out_shape)));
    dst = full.data();
  }
  static constexpr float kZero = 0.0f;
  const float* ls = kReadsOperands ? lhs.as<float>() : &kZero;
  const float* rs = kReadsOperands ? rhs.as<float>() : &kZero;
  const float* dys = dy.as<float>();
  const float* ys = y != nullptr ? y->as<float>() : nullptr;
  const int64_t s0 = kReadsOperands ? plan.step(0) : 0, s1 = kReadsOperands ? plan.step(1) : 0;
  plan.for_each_run([&](int64_t o, const std::array<int64_t, 2>& in, int64_t count) {
    const float* l = ls + in[0];
    const float* r = rs + in[1];
    float* out = dst + o;
    const float* d = dys + o;
    if (ys == nullptr && s0 <= 1 && s1 <= 1) {
      // Each operand along the row or repeated (a scale, a bias): loops the compiler vectorises
      // (with the strides unknown it vectorised none).
      if (s0 == 1 && s1 == 1) {
#pragma omp simd
        for (int64_t i = 0; i < count; ++i) out[i] = f(l[i], r[i], 0.0f, d[i]);
      } else if (s0 == 1) {
        const float rv = *r;
#pragma omp simd
        for (int64_t i = 0; i < count; ++i) out[i] = f(l[i], rv, 0.0f, d[i]);
      } else if (s1 == 1) {
        const float lv = *l;
#pragma omp simd
        for (int64_t i = 0; i < count; ++i) out[i] = f(lv, r[i], 0.0f, d[i]);
      } else {
        const float lv = *l, rv = *r;
#pragma omp simd
        for (int64_t i = 0; i < count; ++i) out[i] = f(lv, rv, 0.0f, d[i]);
      }
      return;
    }
    for (int64_t i = 0; i < count; ++i)
      out[i] = f(l[i * s0], r[i * s1], ys != nullptr ? ys[o + i] : 0.0f, d[i]);
  });
  if (!direct) sum_to_shape(full.data(), out_shape, dx.as<float>(), xk.shape);
}

using Binary = ops::BinaryGradOperands;  // read by ops::binary_operands
using ops::binary_operands;

/// float32, or an omitted operand.
inline bool float_or_absent(DType d) { return d == DType::kUndefined || d == DType::kFloat32; }

/// One forward input and output (unary ops), two inputs and one output (binary ops).
inline constexpr ops::GradArity kUnaryArity{.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1};
inline constexpr ops::GradArity kBinaryArity{.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1};

/// Every input and output float32 (or absent), with the counts `arity` allows.
inline std::string check_float_grad(const OpSignature& s, const ops::GradArity& arity) {
  if (auto why = ops::grad_arity_error(s, arity); !why.empty()) return why;
  for (DType d : s.inputs)
    if (!float_or_absent(d))
      return fmt::format("{} on {} is not supported (the cpu backend differentiates float32 only)",
                         s.op_type, dtype_name(d));
  for (DType d : s.outputs)
    if (!float_or_absent(d))
      return fmt::format("{} producing {} is not supported (float32 only)", s.op_type,
                         dtype_name(d));
  return "";
}

}  // namespace stagecraft::rt::cpu::eltwise
