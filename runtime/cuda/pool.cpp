// The CUDA backend's pool family (families.h): the ops of the CPU backend's pool.cpp, on the
// signatures the CPU accepts (so each check is `same_as_cpu`: float32, MaxPool also int8 and
// uint8), on dense NCHW tensors. MaxPool (with its optional Indices), AveragePool and
// GlobalAveragePool run on the conv family's kernels (conv_kernels.cu), one thread per output
// with ONNX's window rules, which cuDNN's pooling does not match (its include-padding divisor
// counts the ceil_mode extension, and it has no dilated windows). The shapes and attributes are
// resolved by the shared runtime/ops/window.h; the gradients are in grad_conv.cpp, as on the CPU.
#include "runtime/cuda/conv_common.h"
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cuda {
namespace {

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

const KernelEntry kKernels[] = {
    {"MaxPool", max_pool, same_as_cpu},
    {"AveragePool", average_pool, same_as_cpu},
    {"GlobalAveragePool", global_average_pool, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> pool_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
