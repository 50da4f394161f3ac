// Gradients of the elementwise ops (unary, binary with broadcasting undone, Where, Cast). The
// contract every gradient kernel follows is runtime/format/grad_ops.h: inputs x0..x{n-1},
// y0..y{m-1}, dy0..dy{m-1}, outputs dx0..dx{n-1}, n in attribute forward_inputs.
//
// Kernels run on float32 in plain C++ (split among the worker's threads for large tensors). A
// binary op's gradient is computed per output element and, where an input was broadcast, summed
// back to the input's shape (`sum_to_shape`, also used by grad_data.cpp's Expand).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <utility>
#include <vector>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/grad_eltwise_common.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::cpu {

void sum_to_shape(const float* full, const Shape& full_shape, float* out, const Shape& shape) {
  const size_t rank = full_shape.size();
  if (shape.size() > rank)
    fail(ErrorKind::kShape, "cannot sum {} to the larger-rank {}", shape_string(full_shape),
         shape_string(shape));
  const size_t lead = rank - shape.size();
  // Groups of neighbouring dims (innermost first, size-1 dims dropped), each kept or reduced.
  std::vector<std::pair<int64_t, bool>> groups;
  for (size_t i = rank; i-- > 0;) {
    const int64_t d = full_shape[i];
    const int64_t s = i < lead ? 1 : shape[i - lead];
    if (s != d && s != 1)
      fail(ErrorKind::kShape, "{} does not broadcast to {}", shape_string(shape),
           shape_string(full_shape));
    if (d == 1) continue;
    const bool reduced = s != d;
    if (!groups.empty() && groups.back().second == reduced)
      groups.back().first *= d;
    else
      groups.emplace_back(d, reduced);
  }
  const int64_t n_out = shape_numel(shape);
  if (n_out == 0) return;
  if (shape_numel(full_shape) == 0) {
    std::fill_n(out, n_out, 0.0f);
    return;
  }
  const ops::ReductionLayout layout(groups);
  // Named references, not a structured binding: clang 14 (the fuzzing build) cannot use a
  // binding inside the OpenMP regions below.
  const std::vector<int64_t>& kept_dims = layout.kept_dims;
  const std::vector<int64_t>& kept_strides = layout.kept_strides;
  const std::vector<int64_t>& offsets = layout.offsets;
  const int64_t count = static_cast<int64_t>(offsets.size());
  // When the innermost group is kept, output elements come in contiguous rows of `inner` that
  // read contiguous input: add whole rows per reduced offset.
  const bool inner_kept = !groups.empty() && !groups.front().second;
  const int64_t inner = inner_kept ? kept_dims.front() : 1;
  const size_t first_outer = inner_kept ? 1 : 0;
  const int64_t rows = n_out / inner;
  const int64_t total = shape_numel(full_shape);
  constexpr int64_t kParallel = int64_t{1} << 15;
  if (rows == 1 && total >= kParallel && omp_get_max_threads() > 1) {
    // One output row (a bias's gradient, a full sum): the threads split the reduced offsets,
    // each summing into its own row, and the rows are added at the end.
    const int64_t slots = omp_get_max_threads();
    std::vector<double> partial(static_cast<size_t>(slots * inner), 0.0);
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      double* acc = partial.data() + t * inner;
      for (int64_t k = count * t / nt; k < count * (t + 1) / nt; ++k) {
        const float* src = full + offsets[k];
#pragma omp simd
        for (int64_t j = 0; j < inner; ++j) acc[j] += src[j];
      }
    }
    for (int64_t j = 0; j < inner; ++j) {
      double sum = 0;
      for (int64_t t = 0; t < slots; ++t) sum += partial[t * inner + j];
      out[j] = static_cast<float>(sum);
    }
    return;
  }
#pragma omp parallel for if (rows > 1 && total >= kParallel)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base = 0, rest = r;
    for (size_t g = first_outer; g < kept_dims.size(); ++g) {
      base += (rest % kept_dims[g]) * kept_strides[g];
      rest /= kept_dims[g];
    }
    float* dst = out + r * inner;
    if (inner_kept) {
      std::fill_n(dst, inner, 0.0f);
      for (int64_t k = 0; k < count; ++k) {
        const float* src = full + base + offsets[k];
#pragma omp simd
        for (int64_t j = 0; j < inner; ++j) dst[j] += src[j];
      }
    } else {
      double sum = 0;
      for (int64_t k = 0; k < count; ++k) sum += full[base + offsets[k]];
      dst[0] = static_cast<float>(sum);
    }
  }
}

namespace {

using namespace eltwise;

// ---------------------------------------------------------------------------------------------
// Unary ops

// dX = dY where X > 0, computed from Y where the runtime hands it over (ops::relu_mask_in_x).
void relu_grad(const KernelArgs& a) {
  std::vector<const Tensor*> in;
  unary_grad(
      ops::relu_mask_in_x(a, in), [](float x) { return x > 0 ? x : 0.0f; },
      [](float x, float, float dy) { return x > 0 ? dy : 0.0f; });
}

void sigmoid_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return 1 / (1 + std::exp(-x)); },
      [](float, float y, float dy) { return dy * y * (1 - y); });
}

void tanh_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return std::tanh(x); },
      [](float, float y, float dy) { return dy * (1 - y * y); });
}

void sqrt_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return std::sqrt(x); },
      [](float, float y, float dy) { return dy * 0.5f / y; });
}

// d erf(x) / dx = 2 / sqrt(pi) * exp(-x^2).
void erf_grad(const KernelArgs& a) {
  constexpr float k = 2 * std::numbers::inv_sqrtpi_v<float>;
  unary_grad(
      a, [](float x) { return std::erf(x); },
      [](float x, float, float dy) { return dy * k * std::exp(-x * x); });
}

void hard_sigmoid_grad(const KernelArgs& a) {
  const float alpha = a.attrs.f("alpha", 0.2f), beta = a.attrs.f("beta", 0.5f);
  unary_grad(
      a, [](float x) { return x; },
      [=](float x, float, float dy) {
        const float v = alpha * x + beta;
        return v > 0 && v < 1 ? alpha * dy : 0.0f;
      });
}

// HardSwish(x) = x * clamp(x / 6 + 1/2, 0, 1): the slope is 0 below -3, 1 above 3 and
// x / 3 + 1/2 between.
void hard_swish_grad(const KernelArgs& a) {
  unary_grad(
      a, [](float x) { return x; },
      [](float x, float, float dy) {
        if (x <= -3) return 0.0f;
        if (x >= 3) return dy;
        return dy * (x / 3 + 0.5f);
      });
}

// The one value of Clip's optional bound input k, or `fallback` when it is omitted.
float clip_bound(const ops::GradIo& io, size_t k, float fallback) {
  const Tensor* t = io.x(k);
  if (t == nullptr) return fallback;
  if (t->numel() != 1)
    fail(ErrorKind::kShape, "Clip's {} must be a scalar, not {}", k == 1 ? "min" : "max",
         shape_string(t->shape));
  return t->as<float>()[0];
}

// Clip: the gradient passes where min < x < max (bounds as the forward kernel reads them:
// attributes up to opset 6, inputs from opset 11). The bounds get no gradient.
void clip_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  const float lo = a.attrs.has("min") ? a.attrs.f("min", 0)
                                      : clip_bound(io, 1, -std::numeric_limits<float>::infinity());
  const float hi = a.attrs.has("max") ? a.attrs.f("max", 0)
                                      : clip_bound(io, 2, std::numeric_limits<float>::infinity());
  unary_grad(
      a, [](float x) { return x; },
      [=](float x, float, float dy) { return x > lo && x < hi ? dy : 0.0f; });
}

// Dropout as the forward kernel runs it: in training mode with a nonzero ratio r, dx = dy x mask
// / (1 - r) with the forward's own mask (its output 1, which the compiler keeps in training);
// otherwise the identity, dx = dy. The ratio, training_mode and the mask get no gradient.
void dropout_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  const Tensor* training = io.x(2);
  float ratio = 0;
  if (training != nullptr && ops::scalar_is_nonzero(*training, "training_mode"))
    ratio = io.x(1) != nullptr ? ops::dropout_ratio(*io.x(1)) : 0.5f;
  if (a.attrs.i("is_test", 1) == 0)
    fail(ErrorKind::kUnsupported, "DropoutGrad with is_test=0 (training) is not supported");
  for (size_t k = 1; k < io.n; ++k) zero_output(io, k);  // ratio and training_mode get none
  Tensor* dx = io.dx(0);
  const Tensor* dy = io.dy(0);
  if (dx == nullptr) return;
  if (dy == nullptr) return ops::zero(*dx);
  expect_dx_shape(a, 0, io.need_x(0).shape);
  ops::expect_dy_shape(a, *dy, dx->shape);
  if (ratio == 0) {
    if (dx->data != dy->data) std::memmove(dx->data, dy->data, static_cast<size_t>(dx->bytes()));
    return;
  }
  const Tensor* mask = io.y(1);
  ops::check_dropout_grad(mask, *dx);
  const float scale = 1.0f / (1.0f - ratio);
  const uint8_t* keep = mask->as<uint8_t>();
  const float* g = dy->as<float>();
  float* out = dx->as<float>();
  const int64_t n = dx->numel();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = keep[i] != 0 ? g[i] * scale : 0.0f;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exponent = (h >> 10) & 0x1fu,
                 mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mantissa << 13);
  if (exponent == 0) {
    float v = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (exponent + 112) << 23 | mantissa << 13);
}

// Cast: the gradient of a float32 input is dy cast back to float32 (from float32, float64,
// float16 or bfloat16); other inputs get none.
void cast_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx = io.dx(0);
  const Tensor* dy = io.dy(0);
  if (dx == nullptr) return;
  if (dy == nullptr) return ops::zero(*dx);
  const Tensor& x = io.need_x(0);
  expect_dx_shape(a, 0, x.shape);
  ops::expect_dy_shape(a, *dy, x.shape);
  const int64_t n = x.numel();
  float* out = dx->as<float>();
  switch (dy->dtype) {
    case DType::kFloat32:
      if (dx->data != dy->data) std::memmove(out, dy->data, static_cast<size_t>(dx->bytes()));
      return;
    case DType::kFloat64: {
      const double* in = dy->as<double>();
#pragma omp parallel for simd if (parallel : n >= kGradParallelElements)
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
      return;
    }
    case DType::kFloat16: {
      const uint16_t* in = dy->as<uint16_t>();
#pragma omp parallel for if (n >= kGradParallelElements)
      for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* in = dy->as<uint16_t>();
#pragma omp parallel for simd if (parallel : n >= kGradParallelElements)
      for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t{in[i]} << 16);
      return;
    }
    default:
      fail(ErrorKind::kUnsupported, "CastGrad with a {} output gradient is not supported",
           dtype_name(dy->dtype));
  }
}

// ---------------------------------------------------------------------------------------------
// Binary ops with broadcasting undone

template <Arith op>
void arith_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  // Add and Sub read only dY (their operands come bare: grad_reads.h).
  constexpr bool reads = op == Arith::kMul || op == Arith::kDiv;
  if constexpr (!reads) {
    // A broadcast operand's gradient (a bias's) is dY summed to its shape, straight from dY:
    // the same sums as through a copy of dY the size of the output, which this saves (a
    // ViT's in_proj bias gradient, 7 MB a call, was written, read and freed again).
    for (size_t k = 0; k < 2; ++k) {
      Tensor* dx = io.dx(k);
      const Tensor& xk = k == 0 ? *b.lhs : *b.rhs;
      if (dx == nullptr || xk.shape == b.dy->shape) continue;
      expect_dx_shape(a, k, xk.shape);
      sum_to_shape(b.dy->as<float>(), b.dy->shape, dx->as<float>(), xk.shape);
      if (op == Arith::kSub && k == 1) {  // -(sum) is the sum of the negations, bit for bit
        float* d = dx->as<float>();
        const int64_t n = dx->numel();
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) d[i] = -d[i];
      }
    }
  }
  auto broadcast_done = [&](size_t k) {
    const Tensor& xk = k == 0 ? *b.lhs : *b.rhs;
    return !reads && xk.shape != b.dy->shape;
  };
  if (io.dx(0) != nullptr && !broadcast_done(0)) {
    binary_part<reads>(a, 0, *b.lhs, *b.rhs, nullptr, *b.dy, [](float, float v, float, float d) {
      if constexpr (op == Arith::kMul)
        return d * v;
      else if constexpr (op == Arith::kDiv)
        return d / v;
      else
        return d;
    });
  }
  if (io.dx(1) != nullptr && !broadcast_done(1)) {
    binary_part<reads>(a, 1, *b.lhs, *b.rhs, nullptr, *b.dy, [](float u, float v, float, float d) {
      if constexpr (op == Arith::kAdd)
        return d;
      else if constexpr (op == Arith::kSub)
        return -d;
      else if constexpr (op == Arith::kMul)
        return d * u;
      else
        return -d * u / (v * v);
    });
  }
}

// Pow: d/dbase = e * base^(e-1), d/dexp = y * ln(base) where base > 0 (else 0). An int32 or
// int64 exponent is read as float32 for the base's gradient (it gets none itself).
void pow_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  Tensor exponent = *b.rhs;
  if (b.rhs->dtype != DType::kFloat32) {
    exponent = Tensor::owned(DType::kFloat32, b.rhs->shape);
    const int64_t n = b.rhs->numel();
    for (int64_t i = 0; i < n; ++i)
      exponent.as<float>()[i] = b.rhs->dtype == DType::kInt64
                                    ? static_cast<float>(b.rhs->as<int64_t>()[i])
                                    : static_cast<float>(b.rhs->as<int32_t>()[i]);
  }
  if (io.dx(0) != nullptr)
    binary_part(a, 0, *b.lhs, exponent, nullptr, *b.dy, [](float u, float e, float, float d) {
      if (e == 0) return 0.0f;
      if (e == 1) return d;
      if (e == 2) return d * 2 * u;
      return d * e * std::pow(u, e - 1);
    });
  if (io.dx(1) != nullptr) {
    if (b.rhs->dtype != DType::kFloat32)
      fail(ErrorKind::kUnsupported, "PowGrad: an integer exponent has no gradient");
    if (b.y != nullptr)
      binary_part(a, 1, *b.lhs, exponent, b.y, *b.dy, [](float u, float, float y, float d) {
        return u > 0 ? d * y * std::log(u) : 0.0f;
      });
    else
      binary_part(a, 1, *b.lhs, exponent, nullptr, *b.dy, [](float u, float e, float, float d) {
        return u > 0 ? d * std::pow(u, e) * std::log(u) : 0.0f;
      });
  }
}

// Where: dy goes to x where the condition holds and to y elsewhere; the condition gets none.
void where_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  const Tensor* dy = io.dy(0);
  zero_output(io, 0);  // the condition gets none
  if (dy == nullptr) ops::zero_outputs(a);
  if (dy == nullptr || (io.dx(1) == nullptr && io.dx(2) == nullptr)) return;
  const Tensor &cond = io.need_x(0), &x = io.need_x(1), &y = io.need_x(2);
  Shape out = ops::broadcast_shape(ops::broadcast_shape(cond.shape, x.shape), y.shape);
  ops::expect_dy_shape(a, *dy, out);
  Broadcast<1> plan({cond.shape}, out);
  const uint8_t* c = cond.as<uint8_t>();
  const float* d = dy->as<float>();
  const int64_t sc = plan.step(0);
  for (size_t k = 1; k <= 2; ++k) {
    Tensor* dx = io.dx(k);
    if (dx == nullptr) continue;
    const Shape& shape = io.x(k)->shape;
    expect_dx_shape(a, k, shape);
    const bool direct = shape == out;
    std::vector<float> full;
    float* dst = dx->as<float>();
    if (!direct) {
      full.resize(static_cast<size_t>(shape_numel(out)));
      dst = full.data();
    }
    const bool take_true = k == 1;
    plan.for_each_run([&](int64_t o, const std::array<int64_t, 1>& in, int64_t count) {
      const uint8_t* cs = c + in[0];
      float* out = dst + o;
      const float* ds = d + o;
      if (sc == 1) {  // a condition along the row (an attention mask's): a vectorised bit select
        const uint32_t flip = take_true ? 0u : ~0u;
#pragma omp simd
        for (int64_t i = 0; i < count; ++i) {
          const uint32_t keep = (0u - static_cast<uint32_t>(cs[i] != 0)) ^ flip;
          out[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(ds[i]) & keep);
        }
      } else {
        for (int64_t i = 0; i < count; ++i) out[i] = (cs[i * sc] != 0) == take_true ? ds[i] : 0.0f;
      }
    });
    if (!direct) sum_to_shape(full.data(), out, dx->as<float>(), shape);
  }
}

// Equal has no gradient: its outputs are never requested (and are zeros if they are).
void equal_grad(const KernelArgs& a) { ops::zero_outputs(a); }

// ---------------------------------------------------------------------------------------------
// Checks

// Clip: inputs x, [min] and [max].
constexpr ops::GradArity kClipArity{.n_min = 1, .n_max = 3, .m_min = 1, .m_max = 1};

std::string check_unary(const OpSignature& s) { return check_float_grad(s, kUnaryArity); }
std::string check_binary(const OpSignature& s) { return check_float_grad(s, kBinaryArity); }
std::string check_clip(const OpSignature& s) { return check_float_grad(s, kClipArity); }

std::string check_pow(const OpSignature& s) {
  if (auto why = ops::grad_arity_error(s, kBinaryArity); !why.empty()) return why;
  const DType e = s.inputs[1];
  if (e == DType::kInt32 || e == DType::kInt64) {
    if (s.outputs[1] != DType::kUndefined) return "PowGrad: an integer exponent has no gradient";
    std::vector<DType> rest(s.inputs.begin(), s.inputs.end());
    rest[1] = DType::kFloat32;
    return check_float_grad({s.op_type, rest, s.outputs, s.attrs}, kBinaryArity);
  }
  return check_float_grad(s, kBinaryArity);
}

std::string check_where(const OpSignature& s) {
  if (auto why = ops::grad_arity_error(s, {.n_min = 3, .n_max = 3, .m_min = 1, .m_max = 1});
      !why.empty())
    return why;
  if (s.inputs[0] != DType::kBool)
    return fmt::format("WhereGrad with a {} condition is not valid", dtype_name(s.inputs[0]));
  if (s.outputs[0] != DType::kUndefined) return "WhereGrad: the condition has no gradient";
  for (size_t k = 1; k < s.inputs.size(); ++k)
    if (!float_or_absent(s.inputs[k]))
      return fmt::format("WhereGrad on {} is not supported (float32 only)",
                         dtype_name(s.inputs[k]));
  for (DType d : s.outputs)
    if (!float_or_absent(d))
      return fmt::format("WhereGrad producing {} is not supported", dtype_name(d));
  return "";
}

std::string check_dropout(const OpSignature& s) {
  // Inputs data, [ratio], [training_mode]; outputs Y, [mask].
  const ops::GradCounts c = ops::grad_counts(s.op_type, s.attrs, s.inputs.size(), s.outputs.size(),
                                             {.n_min = 1, .n_max = 3, .m_min = 1, .m_max = 2});
  if (!c.error.empty()) return c.error;
  const size_t n = c.n, m = c.m;
  if (s.inputs[0] != DType::kFloat32)
    return fmt::format("DropoutGrad on {} is not supported (float32 only)",
                       dtype_name(s.inputs[0]));
  if (!float_or_absent(s.inputs[n + m])) return "DropoutGrad needs a float32 output gradient";
  if (!float_or_absent(s.outputs[0])) return "DropoutGrad produces float32";
  for (size_t k = 1; k < n; ++k)
    if (s.outputs[k] != DType::kUndefined)
      return "DropoutGrad: ratio and training_mode have no gradient";
  if (s.attrs.i("is_test", 1) == 0) return "DropoutGrad with is_test=0 (training) is not supported";
  return "";
}

std::string check_cast(const OpSignature& s) {
  if (auto why = ops::grad_arity_error(s, kUnaryArity); !why.empty()) return why;
  if (s.outputs[0] == DType::kUndefined) return "";
  if (s.inputs[0] != DType::kFloat32 || s.outputs[0] != DType::kFloat32)
    return fmt::format("CastGrad to a {} input is not supported (float32 only)",
                       dtype_name(s.inputs[0]));
  const DType dy = s.inputs[2];
  if (dy != DType::kUndefined && dy != DType::kFloat32 && dy != DType::kFloat64 &&
      dy != DType::kFloat16 && dy != DType::kBFloat16)
    return fmt::format("CastGrad from a {} output gradient is not supported", dtype_name(dy));
  return "";
}

std::string check_equal(const OpSignature& s) { return ops::grad_arity_error(s); }

// Every kernel here writes every element of the outputs it is given: an elementwise result per
// element (summed back where the input was broadcast, sum_to_shape overwriting its output), or
// zeros for inputs that get no gradient and where dy is omitted.

constexpr KernelEntry kKernels[] = {
    {"ReluGrad", relu_grad, check_unary, /*writes_every_output=*/true},
    {"SigmoidGrad", sigmoid_grad, check_unary, /*writes_every_output=*/true},
    {"TanhGrad", tanh_grad, check_unary, /*writes_every_output=*/true},
    {"SqrtGrad", sqrt_grad, check_unary, /*writes_every_output=*/true},
    {"ErfGrad", erf_grad, check_unary, /*writes_every_output=*/true},
    {"HardSigmoidGrad", hard_sigmoid_grad, check_unary, /*writes_every_output=*/true},
    {"HardSwishGrad", hard_swish_grad, check_unary, /*writes_every_output=*/true},
    {"ClipGrad", clip_grad, check_clip, /*writes_every_output=*/true},
    {"DropoutGrad", dropout_grad, check_dropout, /*writes_every_output=*/true},
    {"CastGrad", cast_grad, check_cast, /*writes_every_output=*/true},
    {"AddGrad", arith_grad<Arith::kAdd>, check_binary, /*writes_every_output=*/true},
    {"SubGrad", arith_grad<Arith::kSub>, check_binary, /*writes_every_output=*/true},
    {"MulGrad", arith_grad<Arith::kMul>, check_binary, /*writes_every_output=*/true},
    {"DivGrad", arith_grad<Arith::kDiv>, check_binary, /*writes_every_output=*/true},
    {"PowGrad", pow_grad, check_pow, /*writes_every_output=*/true},
    {"WhereGrad", where_grad, check_where, /*writes_every_output=*/true},
    {"EqualGrad", equal_grad, check_equal, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_eltwise_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
