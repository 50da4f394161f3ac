// The CUDA backend's pad family (families.h): Pad and PadGrad, over the same ops, attributes and
// dtypes as the CPU backend's pad.cpp. The node is read with the shared rules
// (runtime/ops/pad_shape.h: mode, pads as input or attribute, the constant, negative pads,
// reflections past the dim), its small operands brought to the host first; the per-dim tables
// that geometry gives are uploaded once per call and both kernels read them (pad_element.h):
// Pad one thread per output element, PadGrad one thread per dx element gathering the dy
// positions that read it in a fixed order (no atomics, reproducible, equal to the CPU's sums).
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/pad_kernels.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/pad_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;

// The geometry of a Pad of X (shape `x_shape`) whose pads operand, on the device, is `pads`
// (null when omitted or given as the attribute).
ops::PadGeometry geometry(const KernelArgs& a, CudaContext& ctx, const Shape& x_shape,
                          const Tensor* pads) {
  const bool operand = pads != nullptr && !a.attrs.has("pads");
  const Tensor host = operand ? host_ints(ctx, pads) : Tensor{};
  return ops::pad_geometry(a, x_shape, operand ? &host : nullptr);
}

// The geometry's tables on the device: `storage` keeps them until the kernel has read them
// (its memory goes back to the pool in stream order).
PadTables upload_tables(CudaContext& ctx, const ops::PadGeometry& g, const Shape& x_shape,
                        Tensor& storage) {
  const PadTableData data = pad_tables(x_shape, g.y_shape, g.source);
  storage = upload_ints(ctx, data.values);
  return data.at(storage.as<int64_t>());
}

void pad(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  CudaContext& ctx = context(a);
  const ops::PadGeometry g = geometry(a, ctx, x.shape, a.has_input(1) ? a.in[1] : nullptr);
  expect_shape(a, 0, g.y_shape);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  Tensor constant_operand;
  if (a.has_input(2)) {
    const Tensor& c = *a.in[2];
    constant_operand = Tensor::owned(c.dtype, c.shape);
    ctx.read(c, constant_operand.data, c.bytes());
  }
  const std::vector<std::byte> constant =
      ops::pad_constant(a, x, a.has_input(2) ? &constant_operand : nullptr);
  const int64_t size = dtype_size(x.dtype);
  if (size != 1 && size != 4 && size != 8)
    fail(ErrorKind::kUnsupported, "Pad '{}' on {} is not supported", a.name, dtype_name(x.dtype));
  uint64_t value = 0;
  std::memcpy(&value, constant.data(), constant.size());
  Tensor storage;
  const PadTables tables = upload_tables(ctx, g, x.shape, storage);
  launch_pad(y.data, x.data, size, value, y.numel(), tables, ctx.stream());
  check_launch(a);
}

void pad_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 1, .n_max = 3, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *px = nullptr;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  CudaContext& ctx = context(a);
  const ops::PadGeometry g = geometry(a, ctx, x.shape, io.x(1));
  expect_dy_shape(a, *dy, g.y_shape);
  if (dx->numel() == 0) return;
  Tensor storage;
  const PadTables tables = upload_tables(ctx, g, x.shape, storage);
  launch_pad_grad(dx->as<float>(), dy->as<float>(), dx->numel(), tables, ctx.stream());
  check_launch(a);
}

// The CPU backend's checks decide; the gradient writes every element of dx (or zeroes it when
// dy is omitted), as the CPU's does.
constexpr KernelEntry kKernels[] = {
    {"Pad", pad, same_as_cpu},
    {"PadGrad", pad_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> pad_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
