// The CUDA backend's rearrange family (families.h): DepthToSpace, SpaceToDepth and TopK and
// their gradients, over the same ops, attributes and dtypes as the CPU backend's rearrange.cpp.
// The nodes are read with the shared rules (runtime/ops/rearrange_shape.h), TopK's K brought
// to the host to be checked; the kernels (rearrange_kernels.cu) run the CPU's index functions.
// The gradients are the inverse permutation (DepthToSpace, SpaceToDepth) and a scatter of
// dValues into a zeroed dX at the chosen positions, distinct in each line (TopK): no atomics.
#include <fmt/format.h>

#include <optional>

#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/rearrange_kernels.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/rearrange_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;

// A host copy of a device operand; null stays null.
std::optional<Tensor> to_host(CudaContext& ctx, const Tensor* t) {
  if (t == nullptr) return std::nullopt;
  Tensor host = Tensor::owned(t->dtype, t->shape);
  if (host.bytes() > 0) ctx.read(*t, host.data, host.bytes());
  return host;
}

// ---- DepthToSpace, SpaceToDepth -------------------------------------------------------------

void space_depth(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const bool to_space = a.op_type == "DepthToSpace";
  const ops::SpaceDepthShape s = ops::space_depth_shape(a, x.shape, to_space);
  expect_shape(a, 0, to_space ? ops::space_shape(s) : ops::deep_shape(s));
  CudaContext& ctx = context(a);
  launch_space_depth(a.out[0]->data, x.data, movable_size(a, x.dtype), s, to_space, ctx.stream());
  check_launch(a);
}

void space_depth_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const bool to_space = a.op_type == "DepthToSpaceGrad";
  const ops::SpaceDepthShape s = ops::space_depth_shape(a, x->shape, to_space);
  expect_dy_shape(a, *dy, to_space ? ops::space_shape(s) : ops::deep_shape(s));
  CudaContext& ctx = context(a);
  launch_space_depth(dx->data, dy->data, sizeof(float), s, !to_space, ctx.stream());
  check_launch(a);
}

// ---- TopK ------------------------------------------------------------------------------------

NumberType topk_number_type(const KernelArgs& a, DType dtype) {
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
      fail(ErrorKind::kUnsupported, "TopK '{}' on {} is not supported", a.name, dtype_name(dtype));
  }
}

void topk(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  CudaContext& ctx = context(a);
  const std::optional<Tensor> k = to_host(ctx, a.has_input(1) ? &a.input(1) : nullptr);
  const ops::TopKShape s = ops::topk_shape(a, x.shape, k ? &*k : nullptr);
  const Shape y = ops::topk_output_shape(x.shape, s);
  expect_shape(a, 0, y);
  expect_shape(a, 1, y);
  launch_topk(a.out[0]->data, a.out[1]->as<int64_t>(), x.data, topk_number_type(a, x.dtype), s,
              ctx.stream());
  check_launch(a);
}

void arg_extreme(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::TopKShape s = ops::arg_shape(a, x.shape);
  expect_shape(a, 0, ops::arg_output_shape(a, x.shape, s));
  launch_arg_extreme(a.out[0]->as<int64_t>(), x.data, topk_number_type(a, x.dtype), s,
                     a.attrs.i("select_last_index", 0) != 0, context(a).stream());
  check_launch(a);
}

void topk_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 1, .n_max = 2, .m_min = 2, .m_max = 2});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (io.n > 1 && io.dx(1) != nullptr) a.device.fill_zero(*io.dx(1));
  if (!io.input0(dx, dy, x)) return;
  CudaContext& ctx = context(a);
  const std::optional<Tensor> k = to_host(ctx, io.x(1));
  const ops::TopKShape s = ops::topk_shape(a, x->shape, k ? &*k : nullptr);
  const Shape y = ops::topk_output_shape(x->shape, s);
  expect_dy_shape(a, *dy, y);
  const Tensor& indices = io.need_y(1);
  if (indices.shape != y || indices.dtype != DType::kInt64)
    fail(ErrorKind::kShape, "TopKGrad '{}': Indices are {}, expected int64 {}", a.name,
         indices.describe(), shape_string(y));
  a.device.fill_zero(*dx);
  launch_topk_grad(dx->as<float>(), dy->as<float>(), indices.as<int64_t>(), s, ctx.stream());
  check_launch(a);
}

// The CPU backend's checks decide; every gradient writes each element of its outputs, as the
// CPU's do.
constexpr KernelEntry kKernels[] = {
    {"DepthToSpace", space_depth, same_as_cpu},
    {"SpaceToDepth", space_depth, same_as_cpu},
    {"TopK", topk, same_as_cpu},
    {"ArgMax", arg_extreme, same_as_cpu},
    {"ArgMin", arg_extreme, same_as_cpu},
    {"DepthToSpaceGrad", space_depth_grad, same_as_cpu, /*writes_every_output=*/true},
    {"SpaceToDepthGrad", space_depth_grad, same_as_cpu, /*writes_every_output=*/true},
    {"TopKGrad", topk_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> rearrange_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
