// The CUDA backend's conv family (families.h): the ops of the CPU backend's conv.cpp and
// pool.cpp, on the signatures the CPU accepts (so each check is `same_as_cpu`), on dense NCHW
// tensors. Conv (1-D to 3-D, groups, strides, dilations, pads or auto_pad, optional bias; also
// 16-bit throughout) runs on cuDNN (conv_common.h; asymmetric pads made explicit); MaxPool (with its optional Indices),
// AveragePool and GlobalAveragePool run on this family's own kernels (conv_kernels.cu), one
// thread per output with ONNX's window rules, which cuDNN's pooling does not match (its
// include-padding divisor counts the ceil_mode extension, and it has no dilated windows).
// The shapes and attributes are resolved by the shared runtime/ops/window.h.
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

void max_pool(const KernelArgs& a) {
  const ops::PoolGeometry g = ops::pool_forward_geometry(a);
  if (a.out[0]->numel() == 0) return;
  const Tensor& x = a.input(0);
  PoolElement element;
  switch (x.dtype) {
    case DType::kFloat32:
      element = PoolElement::kFloat32;
      break;
    case DType::kInt8:
      element = PoolElement::kInt8;
      break;
    case DType::kUInt8:
      element = PoolElement::kUInt8;
      break;
    default:
      fail(ErrorKind::kUnsupported, "MaxPool on {} is not supported", dtype_name(x.dtype));
  }
  Tensor* indices = a.out.size() > 1 ? a.out[1] : nullptr;
  launch_max_pool(element, x.data, a.out[0]->data,
                  indices != nullptr ? indices->as<int64_t>() : nullptr,
                  a.attrs.i("storage_order", 0) == 1, pool_shape(g), context(a).stream());
  check_launch(a);
}

void average_pool(const KernelArgs& a) {
  const ops::PoolGeometry g = ops::pool_forward_geometry(a);
  if (a.out[0]->numel() == 0) return;
  launch_average_pool(a.input(0).as<float>(), a.out[0]->as<float>(),
                      a.attrs.i("count_include_pad", 0) != 0, pool_shape(g), context(a).stream());
  check_launch(a);
}

void global_average_pool(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const int64_t planes = ops::global_pool_planes(a, x);
  if (planes == 0) return;
  launch_global_average_pool(x.as<float>(), a.out[0]->as<float>(), planes, x.numel() / planes,
                             context(a).stream());
  check_launch(a);
}

// The CPU backend's checks decide (float32 Conv and pooling, MaxPool also on int8 and uint8,
// the attributes' values); Conv also runs bfloat16 or float16 throughout natively (cuDNN with
// float32 accumulation on the tensor cores; the bias added in float32), where the CPU widens.
const KernelEntry kKernels[] = {
    {"Conv", conv, same_as_cpu_16bit},
    {"MaxPool", max_pool, same_as_cpu},
    {"AveragePool", average_pool, same_as_cpu},
    {"GlobalAveragePool", global_average_pool, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> conv_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
