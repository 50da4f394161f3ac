// The CUDA backend's reduce family (families.h): ReduceMean (its gradient is in grad_data.cpp, as
// on the CPU; its kernel is the data family's strided reduction, data_kernels.cu), ReduceSum,
// Max, Min, Prod, L1, L2, SumSquare, LogSum and LogSumExp and their gradients, over the same ops,
// attributes and dtypes as the CPU backend's reduce.cpp. The node is read with the shared rules
// (runtime/ops/reduce_shape.h: axes as attribute or operand, noop_with_empty_axes, keepdims,
// the dims grouped as the CPU's loops group them), the axes operand brought to the host first;
// the kernels (reduce_kernels.cu) then run reduce_element.h's per-element functions, the CPU's
// arithmetic in the CPU's order.
#include <fmt/format.h>

#include <vector>

#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/reduce_kernels.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/reduce_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;
using ops::Reduction;

// The dims the node reduces (ops::reduced_dims), its axes operand (on the device, null when
// omitted) read to the host where the attribute does not give them.
ops::ReducedDims dims_of(const KernelArgs& a, const Shape& x_shape, const Tensor* axes) {
  const bool operand = axes != nullptr && !a.attrs.has("axes");
  const Tensor host = operand ? host_ints(context(a), axes) : Tensor{};
  return ops::reduced_dims(a, x_shape, operand ? &host : nullptr);
}

ReduceGroups groups_of(const KernelArgs& a, const Shape& x_shape,
                       const std::vector<bool>& reduced) {
  const std::vector<std::pair<int64_t, bool>> groups = ops::reduction_groups(x_shape, reduced);
  ReduceGroups s;
  if (!reduce_groups(groups, s))
    fail(ErrorKind::kUnsupported,
         "{} '{}' reduces {} through {} groups of dims; the cuda backend handles at most {}",
         a.op_type, a.name, shape_string(x_shape), groups.size(), kMaxReduceGroups);
  return s;
}

void reduce(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::ReducedDims dims = dims_of(a, x.shape, a.has_input(1) ? a.in[1] : nullptr);
  expect_shape(a, 0, dims.y_shape);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  const ReduceGroups s = groups_of(a, x.shape, dims.reduced);
  const Reduction kind = ops::reduction_of(a.op_type);
  cudaStream_t stream = context(a).stream();
  switch (x.dtype) {
    case DType::kFloat32:
      launch_reduce(y.as<float>(), x.as<float>(), kind, s, stream);
      break;
    case DType::kFloat64:
      launch_reduce(y.as<double>(), x.as<double>(), kind, s, stream);
      break;
    case DType::kInt32:
      launch_reduce(y.as<int32_t>(), x.as<int32_t>(), kind, s, stream);
      break;
    case DType::kInt64:
      launch_reduce(y.as<int64_t>(), x.as<int64_t>(), kind, s, stream);
      break;
    default:
      fail(ErrorKind::kUnsupported, "{} on {} is not supported", a.op_type, dtype_name(x.dtype));
  }
  check_launch(a);
}

void reduce_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 1, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *px = nullptr;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  const ops::ReducedDims dims = dims_of(a, x.shape, io.x(1));
  expect_dy_shape(a, *dy, dims.y_shape);
  if (x.numel() == 0) return;
  const Reduction reduction = ops::reduction_of(a.op_type);
  const float* y = nullptr;
  if (ops::gradient_reads_y(reduction)) {
    const Tensor& yt = io.need_y(0);
    if (yt.shape != dims.y_shape)
      fail(ErrorKind::kShape, "{} '{}': the forward output is {}, expected {}", a.op_type, a.name,
           yt.describe(), shape_string(dims.y_shape));
    y = yt.as<float>();
  }
  const ReduceGroups s = groups_of(a, x.shape, dims.reduced);
  const Reduction kind = reduction;
  CudaContext& ctx = context(a);
  Tensor share;  // Max's and Min's per-output shares of dy
  if (kind == Reduction::kMax || kind == Reduction::kMin)
    share = ctx.new_tensor(DType::kFloat32, {s.outputs}, false);
  launch_reduce_grad(kind, dx->as<float>(), x.as<float>(), y, dy->as<float>(),
                     share.numel() > 0 ? share.as<float>() : nullptr, x.numel(), s, ctx.stream());
  check_launch(a);
}

// ReduceMean (opsets <= 17): the mean over `axes` (every dim when absent), keepdims default 1.
void reduce_mean(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::MeanRule rule = ops::mean_rule(a, x.shape, a.attrs.ints("axes"));
  const std::vector<bool>& reduced = rule.reduced;
  const int64_t count = rule.count;
  expect_shape(a, 0, rule.y_shape);
  Tensor& out = *a.out[0];
  if (out.numel() == 0) return;
  if (count == 0) fail(ErrorKind::kUnsupported, "ReduceMean of {} over an empty dim", x.describe());
  const ReduceMap map = reduce_map(a, x.shape, reduced);
  cudaStream_t stream = context(a).stream();
  switch (x.dtype) {
    case DType::kFloat32:
      launch_reduce_mean_f32(out.as<float>(), x.as<float>(), out.numel(), map, stream);
      break;
    case DType::kFloat64:
      launch_reduce_mean_f64(out.as<double>(), x.as<double>(), out.numel(), map, stream);
      break;
    case DType::kInt32:
      launch_reduce_mean_i32(out.as<int32_t>(), x.as<int32_t>(), out.numel(), map, stream);
      break;
    case DType::kInt64:
      launch_reduce_mean_i64(out.as<int64_t>(), x.as<int64_t>(), out.numel(), map, stream);
      break;
    default:
      fail(ErrorKind::kUnsupported, "ReduceMean on {} is not supported", dtype_name(x.dtype));
  }
  check_launch(a);
}

// The CPU backend's checks decide (float32, float64, int32, int64 forward; float32 gradients).
// Each gradient writes every element of dx (or zeroes it when dy is omitted), as the CPU's do.
constexpr KernelEntry kKernels[] = {
    {"ReduceMean", reduce_mean, same_as_cpu},
    {"ReduceSum", reduce, same_as_cpu},
    {"ReduceMax", reduce, same_as_cpu},
    {"ReduceMin", reduce, same_as_cpu},
    {"ReduceProd", reduce, same_as_cpu},
    {"ReduceL2", reduce, same_as_cpu},
    {"ReduceL1", reduce, same_as_cpu},
    {"ReduceSumSquare", reduce, same_as_cpu},
    {"ReduceLogSum", reduce, same_as_cpu},
    {"ReduceLogSumExp", reduce, same_as_cpu},
    {"ReduceSumGrad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceMaxGrad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceMinGrad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceProdGrad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceL2Grad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceL1Grad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceSumSquareGrad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceLogSumGrad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceLogSumExpGrad", reduce_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> reduce_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
