#pragma once
/// \file
/// Conv and ConvGrad on cuDNN's convolution API (conv_cudnn.cpp), float32, bfloat16 or float16 (with
/// float32 accumulation) on dense NCHW tensors: X
/// [N, C, spatial...], W [M, C / group, kernel...], Y [N, M, spatial...], all row-major, as the
/// runtime keeps every tensor. The geometry is the shared one (ops::ConvGeometry,
/// runtime/ops/window.h), so both backends resolve strides, dilations, groups, pads and auto_pad
/// alike; this header only restates it in cuDNN's terms.
///
/// cuDNN pads symmetrically. Where a node's pads differ before and after (auto_pad SAME_* with
/// an even window, or explicit ONNX pads), cuDNN pads min(before, after) on both sides and the
/// rest is made explicit: X is copied into a zero-padded scratch tensor (conv_kernels.cu)
/// that the convolution reads, and dX is computed on that padded shape and cropped. The
/// alternative, cuDNN padding max(before, after) and the output cropped, shifts every window
/// when the larger pad is after and the difference is not a multiple of the stride, and its
/// weight gradient would need dY padded too; explicit padding is exact in every case, for one
/// copy of X.

#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cuda {

/// One Conv node in cuDNN's terms. Dims are cuDNN's: rank 4 for 1-D and 2-D convolutions (a
/// 1-D one gets a unit height with no padding, stride 1, dilation 1) and rank 5 for 3-D.
struct CudnnConv {
  std::vector<int> x;  ///< the input as the convolution reads it (padded when explicit_pad)
  std::vector<int> w;  ///< the filter: [M, C / group, kernel...]
  std::vector<int> y;  ///< the output: [N, M, spatial...]
  std::vector<int> pad, stride, dilation;  ///< per cuDNN spatial dim; pads symmetric
  int group = 1;
  bool explicit_pad = false;  ///< some dim pads more on one side: X is padded into scratch
  PadShape pad_shape;         ///< X to the padded input, when explicit_pad
  /// The element type of X, W, Y and their gradients: float32, or bfloat16 or float16 (a 16-bit
  /// plan's native convolutions: float32 accumulation on the tensor cores).
  DType dtype = DType::kFloat32;
};

/// The node's geometry `g` (with W of shape `w_shape`, elements of `dtype`) in cuDNN's terms.
/// Throws `Error(kUnsupported)` where a size exceeds cuDNN's int.
CudnnConv cudnn_conv(const KernelArgs& a, const ops::ConvGeometry& g, const Shape& w_shape,
                     DType dtype = DType::kFloat32);

/// X as the convolution reads it: `x` itself, or when the pads are asymmetric a new tensor
/// with X zero-padded (freed in stream order when the caller lets go of it).
Tensor convolution_input(const KernelArgs& a, const CudnnConv& c, const Tensor& x);

/// A new tensor of the padded input's size and the convolution's dtype (dX before cropping).
Tensor new_padded_input(const KernelArgs& a, const CudnnConv& c);

/// y = conv(x, w) (cudnnConvolutionForward, every element of y written); x is
/// `convolution_input`'s.
void cudnn_conv_forward(const KernelArgs& a, const CudnnConv& c, const void* x, const void* w,
                        void* y);

/// dx = the gradient of the (padded) input from w and dy (cudnnConvolutionBackwardData, every
/// element written).
void cudnn_conv_backward_data(const KernelArgs& a, const CudnnConv& c, const void* w,
                              const void* dy, void* dx);

/// dw = the gradient of the filter from the (padded) input x and dy
/// (cudnnConvolutionBackwardFilter, every element written).
void cudnn_conv_backward_filter(const KernelArgs& a, const CudnnConv& c, const void* x,
                                const void* dy, void* dw);

}  // namespace stagecraft::rt::cuda
