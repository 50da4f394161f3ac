// The CUDA backend's indexing family (families.h): Tile, CumSum, GatherElements, ScatterND and
// their gradients, over the same ops, attributes and dtypes as the CPU backend's indexing.cpp.
// The nodes are read with the shared rules (runtime/ops/indexing_shape.h), their small
// operands (repeats, axis) and their indices brought to the host to be checked and turned into
// the same shapes and tables the CPU uses; the kernels (indexing_kernels.cu) run the CPU's
// per-element functions on them. Gradients gather (GatherElementsGrad loops along the axis of
// each data element's readers; ScatterND's are elementwise), so nothing needs atomics and every
// sum is in the CPU's order.
#include <fmt/format.h>

#include <vector>

#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/indexing_kernels.h"
#include "runtime/cuda/resize_kernels.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/indexing_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;

// A host copy of a device operand.
Tensor to_host(CudaContext& ctx, const Tensor& t) {
  Tensor host = Tensor::owned(t.dtype, t.shape);
  if (host.bytes() > 0) ctx.read(t, host.data, host.bytes());
  return host;
}

NumberType number_type(const KernelArgs& a, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return NumberType::kFloat32;
    case DType::kFloat64:
      return NumberType::kFloat64;
    case DType::kInt32:
      return NumberType::kInt32;
    case DType::kInt64:
      return NumberType::kInt64;
    default:
      fail(ErrorKind::kUnsupported, "{} '{}' adds {} elements, which it does not support",
           a.op_type, a.name, dtype_name(dtype));
  }
}

// ---- Tile ------------------------------------------------------------------------------------

void tile(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  CudaContext& ctx = context(a);
  const ops::TileShape s = ops::tile_shape(a, x.shape, to_host(ctx, a.input(1)));
  expect_shape(a, 0, ops::tile_output_shape(s));
  Tensor& y = *a.out[0];
  launch_tile(y.data, x.data, movable_size(a, x.dtype), y.numel(), s, ctx.stream());
  check_launch(a);
}

void tile_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *px = nullptr;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  CudaContext& ctx = context(a);
  const ops::TileShape s = ops::tile_shape(a, x.shape, to_host(ctx, io.need_x(1)));
  expect_dy_shape(a, *dy, ops::tile_output_shape(s));
  if (dx->numel() == 0) return;
  const ops::SeparableTableData data = ops::tile_gradient_tables(s);
  const Tensor ints = upload_ints(ctx, data.ints);
  Tensor floats =
      ctx.new_tensor(DType::kFloat32, {static_cast<int64_t>(data.floats.size())}, false);
  if (floats.bytes() > 0) ctx.write(floats, data.floats.data(), floats.bytes());
  launch_separable_sum(dx->as<float>(), dy->as<float>(), dx->numel(),
                       data.at(ints.as<int64_t>(), floats.as<float>()), ctx.stream());
  check_launch(a);
}

// ---- CumSum ----------------------------------------------------------------------------------

void cumsum(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  expect_shape(a, 0, x.shape);
  CudaContext& ctx = context(a);
  const ops::ScanShape s = ops::scan_shape(a, x.shape, to_host(ctx, a.input(1)));
  launch_scan(a.out[0]->data, x.data, number_type(a, x.dtype), s, ctx.stream());
  check_launch(a);
}

void cumsum_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *px = nullptr;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  if (dy->shape != x.shape)
    fail(ErrorKind::kShape, "CumSumGrad '{}': the output gradient is {} but X is {}", a.name,
         dy->describe(), x.describe());
  CudaContext& ctx = context(a);
  ops::ScanShape s = ops::scan_shape(a, x.shape, to_host(ctx, io.need_x(1)));
  s.reverse = !s.reverse;
  launch_scan(dx->data, dy->data, NumberType::kFloat32, s, ctx.stream());
  check_launch(a);
}

// ---- GatherElements --------------------------------------------------------------------------

// The plan of a GatherElements (indices checked on the host) and its indices on the device.
struct DevicePlan {
  ops::GatherElementsPlan plan;
  Tensor indices;
};

DevicePlan gather_plan(const KernelArgs& a, CudaContext& ctx, const Shape& data_shape,
                       const Tensor& indices) {
  DevicePlan p{ops::gather_elements_plan(a, data_shape, to_host(ctx, indices)), {}};
  p.indices = upload_ints(ctx, p.plan.indices);
  return p;
}

void gather_elements(const KernelArgs& a) {
  const Tensor& data = a.input(0);
  CudaContext& ctx = context(a);
  const DevicePlan p = gather_plan(a, ctx, data.shape, a.input(1));
  expect_shape(a, 0, a.input(1).shape);
  Tensor& y = *a.out[0];
  launch_gather_elements(y.data, data.data, movable_size(a, data.dtype), y.numel(), p.plan.shape,
                         p.indices.as<int64_t>(), ctx.stream());
  check_launch(a);
}

void gather_elements_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *px = nullptr;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  const Tensor& indices = io.need_x(1);
  if (dy->shape != indices.shape)
    fail(ErrorKind::kShape, "GatherElementsGrad '{}': the output gradient is {} but indices are {}",
         a.name, dy->describe(), indices.describe());
  CudaContext& ctx = context(a);
  const DevicePlan p = gather_plan(a, ctx, x.shape, indices);
  launch_gather_elements_grad(dx->as<float>(), dy->as<float>(), dx->numel(), p.plan.shape,
                              p.indices.as<int64_t>(), ctx.stream());
  check_launch(a);
}

// ---- ScatterND -------------------------------------------------------------------------------

// The plan's tables on the device; `storage` keeps them until the kernel has read them.
ops::ScatterPlan upload_plan(CudaContext& ctx, const ops::ScatterPlanData& data, Tensor& storage) {
  storage = upload_ints(ctx, data.values);
  return data.at(storage.as<int64_t>());
}

void scatter_nd(const KernelArgs& a) {
  const Tensor& data = a.input(0);
  const Tensor& updates = a.input(2);
  expect_shape(a, 0, data.shape);
  CudaContext& ctx = context(a);
  const ops::ScatterPlanData plan =
      ops::scatter_plan(a, data.shape, to_host(ctx, a.input(1)), updates.shape);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  const NumberType type = plan.reduction == ops::ScatterReduction::kNone
                              ? NumberType::kFloat32
                              : number_type(a, data.dtype);
  Tensor storage;
  const ops::ScatterPlan p = upload_plan(ctx, plan, storage);
  launch_scatter_nd(y.data, data.data, updates.data, movable_size(a, data.dtype), type, y.numel(),
                    p, ctx.stream());
  check_launch(a);
}

void scatter_nd_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kScatterNdGradArity);
  CudaContext& ctx = context(a);
  const auto o = ops::scatter_nd_grad_operands(a, io, [&](const Tensor& t) { return to_host(ctx, t); });
  if (!o) return;
  const Tensor* dy = o->dy;
  Tensor storage;
  const ops::ScatterPlan p = upload_plan(ctx, o->plan, storage);
  Tensor* dd = io.dx(0);
  Tensor* du = io.dx(2);
  launch_scatter_nd_grad(dd ? dd->as<float>() : nullptr, dd ? dd->numel() : 0,
                         du ? du->as<float>() : nullptr, du ? du->numel() : 0, dy->as<float>(), p,
                         ctx.stream());
  check_launch(a);
}

// The CPU backend's checks decide; every gradient writes each element of its outputs, as the
// CPU's do.
constexpr KernelEntry kKernels[] = {
    {"Tile", tile, same_as_cpu},
    {"TileGrad", tile_grad, same_as_cpu, /*writes_every_output=*/true},
    {"CumSum", cumsum, same_as_cpu},
    {"CumSumGrad", cumsum_grad, same_as_cpu, /*writes_every_output=*/true},
    {"GatherElements", gather_elements, same_as_cpu},
    {"GatherElementsGrad", gather_elements_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ScatterND", scatter_nd, same_as_cpu},
    {"ScatterNDGrad", scatter_nd_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> indexing_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
