// Kernels of the reduce family (see families.h): ReduceMean (its gradient is the data family's
// ReduceMeanGrad, grad_data.cpp), ReduceSum, ReduceMax, ReduceMin, ReduceProd, ReduceL1,
// ReduceL2, ReduceSumSquare, ReduceLogSum and ReduceLogSumExp and their gradients. ReduceMean's
// axes are the attribute (opsets <= 17). The others' come from the attribute `axes` (every
// opset of Max, Min, Prod and L2 that stagecraft imports; ReduceSum before opset 13) or from the
// optional int64 input 1 (ReduceSum from opset 13); no axes reduce every dim, or none with
// noop_with_empty_axes; keepdims (default 1) keeps the reduced dims as 1s. Forward on float32,
// float64, int32 and int64 (L2, LogSum and LogSumExp on floats), accumulating in double or
// int64; the gradients on float32 (contract: runtime/format/grad_ops.h):
//   ReduceSum   dx = dy broadcast back over the reduced dims
//   ReduceProd  dx_i = dy * the product of the other elements (no division: exact at zeros)
//   ReduceMax/Min  dy split evenly between the positions equal to the result, as PyTorch's
//               amax/amin and full max()/min() do (a unique extremum takes all of dy)
//   ReduceL2    dx = dy * x / y, and 0 where y = 0 (PyTorch's norm)
//   ReduceL1    dx = dy * sign(x) (0 at 0, as PyTorch's abs)
//   ReduceSumSquare  dx = 2 x dy
//   ReduceLogSum     dx = dy * exp(-y) (dy / the sum)
//   ReduceLogSumExp  dx = dy * exp(x - y) (the softmax of the reduced elements)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/reduce_shape.h"

namespace stagecraft::rt::cpu {
namespace {

constexpr int64_t kParallelElements = int64_t{1} << 16;

// The reduction as loops: output element o (row-major over the kept dims, which is Y's order
// with or without keepdims) reads X at base(o) + each of `offsets`, in ascending order. Dims are
// grouped first: unit dims dropped, neighbours both kept or both reduced merged.
struct ReduceLoops {
  ops::ReductionLayout layout;
  int64_t outputs = 1;

  ReduceLoops(const Shape& x_shape, const std::vector<bool>& reduced)
      : layout(ops::reduction_groups(x_shape, reduced)) {
    for (int64_t d : layout.kept_dims) outputs *= d;
  }
  int64_t count() const { return static_cast<int64_t>(layout.offsets.size()); }
  int64_t base(int64_t o) const {
    int64_t base = 0;
    for (size_t g = 0; g < layout.kept_dims.size(); ++g) {
      base += (o % layout.kept_dims[g]) * layout.kept_strides[g];
      o /= layout.kept_dims[g];
    }
    return base;
  }
};

// The reduction of `count` values at src[offsets[r]]; an empty reduction gives the operation's
// identity (0, 1, or the lowest / highest value for Max / Min). Max and Min propagate NaN.
template <class T>
T reduce_values(ops::Reduction kind, const T* src, const std::vector<int64_t>& offsets) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  switch (kind) {
    case ops::Reduction::kSum: {
      Acc sum = 0;
      for (int64_t off : offsets) sum += src[off];
      return static_cast<T>(sum);
    }
    case ops::Reduction::kProd: {
      Acc prod = 1;
      for (int64_t off : offsets) prod *= src[off];
      return static_cast<T>(prod);
    }
    case ops::Reduction::kL1: {
      Acc sum = 0;
      for (int64_t off : offsets) sum += src[off] < T(0) ? -src[off] : src[off];
      return static_cast<T>(sum);
    }
    case ops::Reduction::kSumSquare: {
      Acc sum = 0;
      for (int64_t off : offsets) sum += static_cast<Acc>(src[off]) * static_cast<Acc>(src[off]);
      return static_cast<T>(sum);
    }
    case ops::Reduction::kLogSum: {
      double sum = 0;
      for (int64_t off : offsets) sum += static_cast<double>(src[off]);
      return static_cast<T>(std::log(sum));
    }
    case ops::Reduction::kLogSumExp: {
      // Shifted by the largest element, so large inputs do not overflow exp.
      double top = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t off : offsets) top = std::max(top, static_cast<double>(src[off]));
      if (!std::isfinite(top)) top = 0;
      for (int64_t off : offsets) sum += std::exp(static_cast<double>(src[off]) - top);
      return static_cast<T>(std::log(sum) + top);
    }
    case ops::Reduction::kL2: {
      double sum = 0;
      for (int64_t off : offsets)
        sum += static_cast<double>(src[off]) * static_cast<double>(src[off]);
      return static_cast<T>(std::sqrt(sum));
    }
    case ops::Reduction::kMax:
    case ops::Reduction::kMin: {
      const bool max = kind == ops::Reduction::kMax;
      T best = max ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
      if constexpr (std::is_floating_point_v<T>)
        best = max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
      for (int64_t off : offsets) {
        const T v = src[off];
        if constexpr (std::is_floating_point_v<T>)
          if (std::isnan(v)) return v;
        if (max ? v > best : v < best) best = v;
      }
      return best;
    }
  }
  return T(0);
}

template <class T>
void reduce_typed(ops::Reduction kind, const Tensor& x, const ReduceLoops& loops, Tensor& y) {
  const T* src = x.as<T>();
  T* dst = y.as<T>();
  const std::vector<int64_t>& offsets = loops.layout.offsets;
#pragma omp parallel for if (loops.outputs > 1 && x.numel() > kParallelElements)
  for (int64_t o = 0; o < loops.outputs; ++o)
    dst[o] = reduce_values<T>(kind, src + loops.base(o), offsets);
}

void reduce(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::ReducedDims dims = ops::reduced_dims(a, x.shape, a.has_input(1) ? a.in[1] : nullptr);
  expect_shape(a, 0, dims.y_shape);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  const ReduceLoops loops(x.shape, dims.reduced);
  const ops::Reduction kind = ops::reduction_of(a.op_type);
  switch (x.dtype) {
    case DType::kFloat32:
      return reduce_typed<float>(kind, x, loops, y);
    case DType::kFloat64:
      return reduce_typed<double>(kind, x, loops, y);
    case DType::kInt32:
      return reduce_typed<int32_t>(kind, x, loops, y);
    case DType::kInt64:
      return reduce_typed<int64_t>(kind, x, loops, y);
    default:
      fail(ErrorKind::kUnsupported, "{} on {} is not supported", a.op_type, dtype_name(x.dtype));
  }
}

// dx over one output element's reduced positions `at[offsets[r]]` (x at `xs`), given y and dy.
void grad_of_one(ops::Reduction kind, const float* xs, float y, float dy, float* at,
                 const std::vector<int64_t>& offsets) {
  switch (kind) {
    case ops::Reduction::kSum:
      for (int64_t off : offsets) at[off] = dy;
      return;
    case ops::Reduction::kL2:
      for (int64_t off : offsets) at[off] = y == 0.0f ? 0.0f : dy * xs[off] / y;
      return;
    case ops::Reduction::kL1:
      for (int64_t off : offsets) at[off] = xs[off] > 0.0f ? dy : (xs[off] < 0.0f ? -dy : 0.0f);
      return;
    case ops::Reduction::kSumSquare:
      for (int64_t off : offsets) at[off] = 2.0f * xs[off] * dy;
      return;
    case ops::Reduction::kLogSum:
      for (int64_t off : offsets) at[off] = dy * std::exp(-y);
      return;
    case ops::Reduction::kLogSumExp:
      for (int64_t off : offsets) at[off] = dy * std::exp(xs[off] - y);
      return;
    case ops::Reduction::kMax:
    case ops::Reduction::kMin: {
      auto hit = [&](float v) { return v == y || (std::isnan(v) && std::isnan(y)); };
      int64_t ties = 0;
      for (int64_t off : offsets) ties += hit(xs[off]) ? 1 : 0;
      const float share = ties == 0 ? 0.0f : dy / static_cast<float>(ties);
      for (int64_t off : offsets) at[off] = hit(xs[off]) ? share : 0.0f;
      return;
    }
    case ops::Reduction::kProd: {
      // The product of the elements before each position (in dx for a moment), then times
      // the product of those after it.
      double before = 1, after = 1;
      for (int64_t off : offsets) {
        at[off] = static_cast<float>(before);
        before *= xs[off];
      }
      for (auto it = offsets.rbegin(); it != offsets.rend(); ++it) {
        at[*it] = static_cast<float>(static_cast<double>(at[*it]) * after * dy);
        after *= xs[*it];
      }
      return;
    }
  }
}

void reduce_grad(const KernelArgs& a) {
  ops::GradIo io(a, {.n_min = 1, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const ops::ReducedDims dims = ops::reduced_dims(a, x->shape, io.x(1));
  ops::expect_dy_shape(a, *dy, dims.y_shape);
  if (x->numel() == 0) return;
  const ops::Reduction kind = ops::reduction_of(a.op_type);
  const float* y = nullptr;
  if (ops::gradient_reads_y(kind)) {
    const Tensor& yt = io.need_y(0);
    if (yt.shape != dims.y_shape)
      fail(ErrorKind::kShape, "{} '{}': the forward output is {}, expected {}", a.op_type, a.name,
           yt.describe(), shape_string(dims.y_shape));
    y = yt.as<float>();
  }
  const ReduceLoops loops(x->shape, dims.reduced);
  const float* xs = x->as<float>();
  const float* dys = dy->as<float>();
  float* dxs = dx->as<float>();
  const std::vector<int64_t>& offsets = loops.layout.offsets;
  // Every element of X lies in exactly one output's reduced positions: each dx element is
  // written once.
#pragma omp parallel for if (loops.outputs > 1 && x->numel() > kParallelElements)
  for (int64_t o = 0; o < loops.outputs; ++o) {
    const int64_t base = loops.base(o);
    grad_of_one(kind, xs + base, y == nullptr ? 0.0f : y[o], dys[o], dxs + base, offsets);
  }
}

std::string check_reduce(const OpSignature& s) {
  if (s.inputs.empty() || s.inputs.size() > 2 || s.outputs.size() != 1)
    return fmt::format("{} with {} inputs and {} outputs is not a valid signature", s.op_type,
                       s.inputs.size(), s.outputs.size());
  const DType d = s.inputs[0];
  const bool floating = d == DType::kFloat32 || d == DType::kFloat64;
  const bool integer = d == DType::kInt32 || d == DType::kInt64;
  const bool floats_only =
      s.op_type == "ReduceL2" || s.op_type == "ReduceLogSum" || s.op_type == "ReduceLogSumExp";
  if (floats_only ? !floating : !(floating || integer))
    return fmt::format(
        "{} on {} is not supported ({})", s.op_type, dtype_name(d),
        floats_only ? "float32, float64 only" : "float32, float64, int32, int64 only");
  if (s.outputs[0] != d)
    return fmt::format("{} from {} to {} is not a valid signature", s.op_type, dtype_name(d),
                       dtype_name(s.outputs[0]));
  if (s.inputs.size() == 2 && s.inputs[1] != DType::kInt64 && s.inputs[1] != DType::kUndefined)
    return fmt::format("{}'s axes are {}, expected int64", s.op_type, dtype_name(s.inputs[1]));
  return "";
}

std::string check_reduce_grad(const OpSignature& s) {
  const ops::GradArity arity{.n_min = 1, .n_max = 2, .m_min = 1, .m_max = 1};
  if (auto why = ops::grad_arity_error(s, arity); !why.empty()) return why;
  const size_t n = s.outputs.size();
  for (size_t k : {size_t{0}, n, n + 1})
    if (s.inputs[k] != DType::kFloat32 && s.inputs[k] != DType::kUndefined)
      return fmt::format("{} on {} is not supported (float32 only)", s.op_type,
                         dtype_name(s.inputs[k]));
  if (s.outputs[0] != DType::kFloat32 && s.outputs[0] != DType::kUndefined)
    return fmt::format("{} producing {} is not supported (float32 only)", s.op_type,
                       dtype_name(s.outputs[0]));
  if (n == 2 && s.outputs[1] != DType::kUndefined)
    return fmt::format("{} gives no gradient of axes", s.op_type);
  return "";
}

std::string check_reduce_mean(const OpSignature& s) {
  if (s.inputs.size() > 1) return "ReduceMean with axes as an input (opset 18) is not supported";
  DType d = s.inputs.empty() ? DType::kUndefined : s.inputs[0];
  if (d != DType::kFloat32 && d != DType::kFloat64 && d != DType::kInt32 && d != DType::kInt64)
    return fmt::format("ReduceMean on {} is not supported (float32, float64, int32, int64 only)",
                       dtype_name(d));
  return "";
}

// The mean of `in` over the reduced dims into `out`. Dims are grouped first: unit dims dropped,
// neighbours that are both kept or both reduced merged. Each output element (one per index of
// the kept groups, in order) sums the input at its base offset plus each reduced offset.
// Integer means truncate toward zero, as ONNX's reference does.
template <class T>
void reduce_mean_typed(const Tensor& in, const std::vector<bool>& reduced, Tensor& out) {
  std::vector<std::pair<int64_t, bool>> groups;  // (size, reduced), innermost first
  for (int64_t i = in.rank() - 1; i >= 0; --i) {
    int64_t d = in.shape[i];
    if (d == 1) continue;
    if (!groups.empty() && groups.back().second == reduced[i])
      groups.back().first *= d;
    else
      groups.emplace_back(d, reduced[i]);
  }
  const ops::ReductionLayout layout(groups);
  // Named references, not a structured binding: clang 14 (the fuzzing build) cannot use a
  // binding inside the OpenMP region below.
  const std::vector<int64_t>& kept_dims = layout.kept_dims;
  const std::vector<int64_t>& kept_strides = layout.kept_strides;
  const std::vector<int64_t>& red_dims = layout.red_dims;
  const std::vector<int64_t>& red_strides = layout.red_strides;
  const std::vector<int64_t>& offsets = layout.offsets;
  const int64_t count = static_cast<int64_t>(offsets.size());
  const bool contiguous = red_dims.size() == 1 && red_strides[0] == 1;

  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  const T* src = in.as<T>();
  T* dst = out.as<T>();
  const int64_t n_out = out.numel();
#pragma omp parallel for if (n_out > 1 && in.numel() > (1 << 16))
  for (int64_t o = 0; o < n_out; ++o) {
    int64_t base = 0, rest = o;
    for (size_t g = 0; g < kept_dims.size(); ++g) {
      base += (rest % kept_dims[g]) * kept_strides[g];
      rest /= kept_dims[g];
    }
    Acc sum = 0;
    if (contiguous) {
      for (int64_t r = 0; r < count; ++r) sum += src[base + r];
    } else {
      for (int64_t r = 0; r < count; ++r) sum += src[base + offsets[r]];
    }
    dst[o] = static_cast<T>(sum / static_cast<Acc>(count));
  }
}

// ReduceMean (opsets <= 17): the mean over `axes` (every dim when absent), keeping them as unit
// dims when keepdims (default 1).
void reduce_mean(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::MeanRule rule = ops::mean_rule(a, x.shape, a.attrs.ints("axes"));
  const std::vector<bool>& reduced = rule.reduced;
  const int64_t count = rule.count;
  expect_shape(a, 0, rule.y_shape);
  Tensor& out = *a.out[0];
  if (out.numel() == 0) return;
  if (count == 0) fail(ErrorKind::kUnsupported, "ReduceMean of {} over an empty dim", x.describe());
  switch (x.dtype) {
    case DType::kFloat32:
      reduce_mean_typed<float>(x, reduced, out);
      break;
    case DType::kFloat64:
      reduce_mean_typed<double>(x, reduced, out);
      break;
    case DType::kInt32:
      reduce_mean_typed<int32_t>(x, reduced, out);
      break;
    case DType::kInt64:
      reduce_mean_typed<int64_t>(x, reduced, out);
      break;
    default:
      fail(ErrorKind::kUnsupported, "ReduceMean on {} is not supported", dtype_name(x.dtype));
  }
}

// Each gradient writes every element of dx (or zeroes it when dy is omitted).
constexpr KernelEntry kKernels[] = {
    {"ReduceMean", reduce_mean, check_reduce_mean},
    {"ReduceSum", reduce, check_reduce},
    {"ReduceMax", reduce, check_reduce},
    {"ReduceMin", reduce, check_reduce},
    {"ReduceProd", reduce, check_reduce},
    {"ReduceL2", reduce, check_reduce},
    {"ReduceL1", reduce, check_reduce},
    {"ReduceSumSquare", reduce, check_reduce},
    {"ReduceLogSum", reduce, check_reduce},
    {"ReduceLogSumExp", reduce, check_reduce},
    {"ReduceSumGrad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceMaxGrad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceMinGrad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceProdGrad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceL2Grad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceL1Grad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceSumSquareGrad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceLogSumGrad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
    {"ReduceLogSumExpGrad", reduce_grad, check_reduce_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> reduce_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
