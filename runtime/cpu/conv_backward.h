#pragma once
/// \file
/// ConvGrad's oneDNN part (grad_conv.cpp calls it; conv.cpp holds it beside the forward, with
/// whose plan cache and scratch buffers it shares a device context's): dX by
/// convolution_backward_data and dW by convolution_backward_weights. A geometry's primitives are
/// built once per context and kept. Like the forward, a convolution whose backward runs faster
/// on oneDNN's blocked layouts, reorders included, gets them: every ungrouped one with a spatial
/// kernel and at least 8 input and output channels (3x3 layers of ResNets and U-Nets: 1.2-4.3x
/// the plain layouts' GEMM, measured with oneDNN 2.7 on AVX-512); a pointwise kernel, a grouped
/// one, or an image stem (3 channels in, where the blocked kernels were 1.5x slower) runs on the
/// dense row-major tensors as they are.

#include "runtime/core/tensor.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cpu {

/// Writes dX (when `dx` is not null) and dW (when `dw` is not null) of the convolution `g` from
/// X, W and dY, all dense row-major float32. Throws dnnl::error where oneDNN cannot run it.
void conv_backward(CpuContext& ctx, const ops::ConvGeometry& g, const Tensor& x, const Tensor& w,
                   const Tensor& dy, Tensor* dx, Tensor* dw);

}  // namespace stagecraft::rt::cpu
