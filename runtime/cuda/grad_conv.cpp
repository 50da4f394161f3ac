// The CUDA backend's gradients of Conv and pooling (families.h), float32 on dense NCHW tensors
// (ConvGrad also bfloat16 or float16: cuDNN with float32 accumulation),
// following the contract of runtime/format/grad_ops.h and the CPU backend's grad_conv.cpp:
// inputs x0..x{n-1}, y0..y{m-1}, dy0..dy{m-1}; outputs dx0..dx{n-1}, each computed only where
// the node names it (so the weight-gradient half of a split ConvGrad computes dW and dB alone,
// and the activation half dX alone).
//
// ConvGrad: dX by cudnnConvolutionBackwardData (on the padded input's shape, then cropped, where
// the pads are asymmetric: conv_common.h), dW by cudnnConvolutionBackwardFilter (reading the
// padded input), dB as the sum of dY over the batch and spatial dims in double. Pooling
// gradients gather per input element in the CPU's order (conv_kernels.cu): MaxPoolGrad routes
// each dy to the first maximum of its window, recomputed from X as the CPU's does;
// AveragePoolGrad spreads dy over its window divided by the forward divisor;
// GlobalAveragePoolGrad spreads dy / size. Every kernel writes every element of the outputs it
// is given (the zero cases by fill_zero), as the CPU's entries declare.
#include <fmt/format.h>

#include <string>

#include "runtime/cuda/conv_common.h"
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;

using ops::zero_outputs;

// ---------------------------------------------------------------------------------------------
// ConvGrad

void conv_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kConvGradArity);
  const Tensor& x = io.need_x(0);
  const Tensor& w = io.need_x(1);
  if (io.dy(0) == nullptr) return zero_outputs(a);
  const Tensor& dy = *io.dy(0);
  const ops::ConvGeometry g = ops::conv_grad_geometry(a, x, w, dy);
  ops::check_conv_grad_outputs(a, x, w, io.x(2), io.wants(0), io.wants(1), io.wants(2));
  if (dy.numel() == 0 || x.numel() == 0) return zero_outputs(a);
  CudaContext& ctx = context(a);
  if (io.wants(0) || io.wants(1)) {
    const CudnnConv c = cudnn_conv(a, g, w.shape, dy.dtype);
    if (io.wants(0)) {
      Tensor& dx = *io.dx(0);
      if (!c.explicit_pad) {
        cudnn_conv_backward_data(a, c, w.data, dy.data, dx.data);
      } else {
        Tensor padded = new_padded_input(a, c);
        cudnn_conv_backward_data(a, c, w.data, dy.data, padded.data);
        launch_crop(c.dtype, padded.data, dx.data, c.pad_shape, ctx.stream());
        check_launch(a);
      }
    }
    if (io.wants(1)) {
      const Tensor input = convolution_input(a, c, x);
      cudnn_conv_backward_filter(a, c, input.data, dy.data, io.dx(1)->data);
    }
  }
  if (io.wants(2)) {
    const int64_t n = dy.shape[0], m = dy.shape[1];
    const int64_t slices = channel_sum_slices(n, m);
    Tensor partial;
    if (slices > 1) partial = ctx.new_tensor(DType::kFloat64, {slices * m}, false);
    launch_channel_sum(dy.dtype, dy.data, io.dx(2)->data, n, m, dy.numel() / (n * m),
                       slices > 1 ? partial.as<double>() : nullptr, slices, ctx.stream());
    check_launch(a);
  }
}

// ---------------------------------------------------------------------------------------------
// Pooling gradients (geometry: runtime/ops/window.h, as the forward)

void max_pool_grad(const KernelArgs& a) {
  const ops::PoolGradOperands p = ops::pool_grad_operands(a, ops::kMaxPoolGradArity);
  if (p.dx == nullptr) return;
  if (p.dy == nullptr) return a.device.fill_zero(*p.dx);
  const ops::PoolGeometry g = ops::pool_grad_geometry(a, *p.x, *p.dy);
  if (p.dx->numel() == 0) return;
  CudaContext& ctx = context(a);
  // Each output's first maximum, recomputed from X (the forward's Indices may be omitted).
  const Tensor argmax = ctx.new_tensor(DType::kInt64, {g.planes * g.out_plane()}, false);
  launch_max_pool_grad(p.x->as<float>(), p.dy->as<float>(), p.dx->as<float>(),
                       const_cast<int64_t*>(argmax.as<int64_t>()), pool_shape(g), ctx.stream());
  check_launch(a);
}

void average_pool_grad(const KernelArgs& a) {
  const ops::PoolGradOperands p = ops::pool_grad_operands(a, ops::kPoolGradArity);
  if (p.dx == nullptr) return;
  if (p.dy == nullptr) return a.device.fill_zero(*p.dx);
  const ops::PoolGeometry g = ops::pool_grad_geometry(a, *p.x, *p.dy);
  if (p.dx->numel() == 0) return;
  launch_average_pool_grad(p.dy->as<float>(), p.dx->as<float>(),
                           a.attrs.i("count_include_pad", 0) != 0, pool_shape(g),
                           context(a).stream());
  check_launch(a);
}

void global_average_pool_grad(const KernelArgs& a) {
  const ops::PoolGradOperands p = ops::pool_grad_operands(a, ops::kPoolGradArity);
  if (p.dx == nullptr) return;
  if (p.dy == nullptr) return a.device.fill_zero(*p.dx);
  const int64_t planes = ops::global_pool_grad_planes(*p.x, *p.dy);
  if (planes == 0) return;
  launch_global_average_pool_grad(p.dy->as<float>(), p.dx->as<float>(), planes,
                                  p.x->numel() / planes, context(a).stream());
  check_launch(a);
}

// The CPU backend's checks decide (float32, MaxPoolGrad's int64 Indices, the contract's arity,
// the attributes' values); ConvGrad also runs bfloat16 or float16 throughout natively, as Conv.
const KernelEntry kKernels[] = {
    {"ConvGrad", conv_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"MaxPoolGrad", max_pool_grad, same_as_cpu, /*writes_every_output=*/true},
    {"AveragePoolGrad", average_pool_grad, same_as_cpu, /*writes_every_output=*/true},
    {"GlobalAveragePoolGrad", global_average_pool_grad, same_as_cpu,
     /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_conv_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
