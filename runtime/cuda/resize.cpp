// The CUDA backend's resize family (families.h): Resize and ResizeGrad, over the same ops,
// attributes and dtypes as the CPU backend's resize.cpp. The node is read with the shared
// rules (runtime/ops/resize_shape.h), its scales and sizes operands brought to the host first;
// the tables that geometry gives are built by the same host code as the CPU's, uploaded once
// per call, and both kernels run the CPU's per-element function on them (one thread per
// destination element; the gradient gathers, so no atomics and the CPU's order of sums).
#include <fmt/format.h>

#include <vector>

#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/resize_kernels.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/resize_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;

// A host copy of a small device operand (null stays null).
Tensor to_host(CudaContext& ctx, const Tensor* t) {
  if (t == nullptr) return {};
  Tensor host = Tensor::owned(t->dtype, t->shape);
  if (host.bytes() > 0) ctx.read(*t, host.data, host.bytes());
  return host;
}

// The geometry of a Resize of X (shape `x_shape`) with scales and sizes on the device (null
// when omitted).
ops::ResizeGeometry geometry(const KernelArgs& a, CudaContext& ctx, const Shape& x_shape,
                             const Tensor* scales, const Tensor* sizes) {
  const Tensor host_scales = to_host(ctx, scales), host_sizes = to_host(ctx, sizes);
  return ops::resize_geometry(a, x_shape, scales != nullptr ? &host_scales : nullptr,
                              sizes != nullptr ? &host_sizes : nullptr);
}

// destination = the separable sum of `data`'s tables over source; `ints` and `floats` keep the
// uploaded tables until the kernel has read them (their memory goes back to the pool in stream
// order).
void run_sum(const KernelArgs& a, CudaContext& ctx, const ops::SeparableTableData& data,
             const float* source, float* destination, int64_t n) {
  const Tensor ints = upload_ints(ctx, data.ints);
  Tensor floats =
      ctx.new_tensor(DType::kFloat32, {static_cast<int64_t>(data.floats.size())}, false);
  if (floats.bytes() > 0) ctx.write(floats, data.floats.data(), floats.bytes());
  launch_separable_sum(destination, source, n, data.at(ints.as<int64_t>(), floats.as<float>()),
                       ctx.stream());
  check_launch(a);
}

const Tensor* operand(const KernelArgs& a, size_t k) { return a.has_input(k) ? a.in[k] : nullptr; }

void resize(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  CudaContext& ctx = context(a);
  const ops::ResizeGeometry g = geometry(a, ctx, x.shape, operand(a, 2), operand(a, 3));
  expect_shape(a, 0, g.y_shape);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  run_sum(a, ctx, ops::resize_forward_tables(g), x.as<float>(), y.as<float>(), y.numel());
}

void resize_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 1, .n_max = 4, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *px = nullptr;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  CudaContext& ctx = context(a);
  const ops::ResizeGeometry g = geometry(a, ctx, x.shape, io.x(2), io.x(3));
  expect_dy_shape(a, *dy, g.y_shape);
  if (dx->numel() == 0) return;
  run_sum(a, ctx, ops::resize_gradient_tables(g), dy->as<float>(), dx->as<float>(), dx->numel());
}

// The CPU backend's checks decide; the gradient writes every element of dx (or zeroes it when
// dy is omitted), as the CPU's does.
constexpr KernelEntry kKernels[] = {
    {"Resize", resize, same_as_cpu},
    {"ResizeGrad", resize_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> resize_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
