// Kernels of the reduce family (see families.h): Softmax on float32 through oneDNN, and
// ReduceMean in plain C++ on float32, float64, int32 and int64.
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/reduce_shape.h"

namespace stagecraft::rt::cpu {
namespace {

using dnnl::memory;

// Softmax with opset 13's semantics: along the single dim `axis` (default -1), seen by oneDNN
// as [outer, axis dim] or [outer, axis dim, inner]. Opsets < 13 coerce the input to 2-D at
// `axis` (default 1) instead; the kernel cannot tell the opsets apart, and the two agree when
// axis is the last dim or the input is 2-D.
void softmax(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  int64_t axis = a.attrs.i("axis", -1);
  if (x.rank() == 0 || axis < -x.rank() || axis >= x.rank())
    fail(ErrorKind::kModel, "Softmax: axis {} is out of range for {}", axis, x.describe());
  if (axis < 0) axis += x.rank();
  expect_shape(a, 0, x.shape);
  if (x.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.shape[i];
  for (int64_t i = axis + 1; i < x.rank(); ++i) inner *= x.shape[i];
  const Shape view = inner == 1 ? Shape{outer, x.shape[axis]} : Shape{outer, x.shape[axis], inner};

  const CpuContext& ctx = context(a);
  dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, plain_desc(view), 1);
  dnnl::softmax_forward::primitive_desc pd(desc, ctx.engine);
  dnnl::stream stream = ctx.stream;
  dnnl::softmax_forward(pd).execute(
      stream, {{DNNL_ARG_SRC, memory(plain_desc(view), ctx.engine, x.data)},
               {DNNL_ARG_DST, memory(plain_desc(view), ctx.engine, a.out[0]->data)}});
  stream.wait();
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

const KernelEntry kKernels[] = {
    {"Softmax", softmax, all_float32},
    {"ReduceMean", reduce_mean, check_reduce_mean},
};

}  // namespace

std::span<const KernelEntry> reduce_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
