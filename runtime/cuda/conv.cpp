// The CUDA backend's conv family (families.h): Conv as the CPU backend's conv.cpp takes it, on
// dense NCHW tensors: 1-D to 3-D, groups, strides, dilations, pads or auto_pad, optional bias;
// float32, and also bfloat16 or float16 throughout, on cuDNN (conv_common.h; asymmetric pads
// made explicit). The shapes and attributes are resolved by the shared runtime/ops/window.h.
#include <fmt/format.h>

#include <string>

#include "runtime/cuda/conv_common.h"
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cuda {
namespace {

// Conv: Y = conv(X, W) by cuDNN, then + B per output channel.
void conv(const KernelArgs& a) {
  const ops::ConvGeometry g = ops::conv_forward_geometry(a);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  const Tensor& w = a.input(1);
  const CudnnConv c = cudnn_conv(a, g, w.shape, y.dtype);
  const Tensor x = convolution_input(a, c, a.input(0));
  cudnn_conv_forward(a, c, x.data, w.data, y.data);
  if (g.bias > 0) {
    const int64_t n = y.shape[0], m = y.shape[1];
    launch_add_channel_bias(y.dtype, y.data, a.input(2).data, n, m, y.numel() / (n * m),
                            context(a).stream());
    check_launch(a);
  }
}

// The CPU backend's checks decide (float32, the attributes' values); Conv also runs bfloat16 or float16 throughout natively (cuDNN with
// float32 accumulation on the tensor cores; the bias added in float32), where the CPU widens.
const KernelEntry kKernels[] = {
    {"Conv", conv, same_as_cpu_16bit, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> conv_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
