// The CUDA backend's ConvTranspose and ConvTransposeGrad (families.h), float32 on dense NCHW
// tensors, with the shared geometry (runtime/ops/conv_transpose_shape.h) and checks
// (`same_as_cpu`).
//
// ConvTranspose is the input gradient of the Conv that maps Y's shape to X's with the same W
// (ops::conv_of_transpose): cuDNN's filter [C, M / group, kernel...] is ONNX's W as it is. So
// Y = cudnnConvolutionBackwardData(W, X) (on the padded output's shape and cropped where that
// Conv's pads are asymmetric, as ConvGrad's dX: conv_common.h), then + B per channel.
// ConvTransposeGrad: dX = that Conv's forward of dY (padded where asymmetric), dW its filter
// gradient from dY and X, dB the sum of dY over the batch and spatial dims in double.
#include "runtime/cuda/conv_common.h"
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/conv_transpose_shape.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradArity;
using ops::GradIo;
using ops::zero_outputs;

constexpr GradArity kArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 1};

void conv_transpose(const KernelArgs& a) {
  const ops::ConvTransposeGeometry g = ops::conv_transpose_forward_geometry(a);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  const Tensor& x = a.input(0);
  const Tensor& w = a.input(1);
  CudaContext& ctx = context(a);
  if (x.numel() == 0) {
    a.device.fill_zero(y);
  } else {
    const CudnnConv c = cudnn_conv(a, ops::conv_of_transpose(g), w.shape);
    if (!c.explicit_pad) {
      cudnn_conv_backward_data(a, c, w.as<float>(), x.as<float>(), y.as<float>());
    } else {
      Tensor padded = new_padded_input(a, c);
      cudnn_conv_backward_data(a, c, w.as<float>(), x.as<float>(), padded.as<float>());
      launch_crop(padded.as<float>(), y.as<float>(), c.pad_shape, ctx.stream());
      check_launch(a);
    }
  }
  if (g.bias) {
    const int64_t n = g.y[0], m = g.y[1];
    launch_add_channel_bias(y.as<float>(), a.input(2).as<float>(), n, m, y.numel() / (n * m),
                            ctx.stream());
    check_launch(a);
  }
}

void conv_transpose_grad(const KernelArgs& a) {
  const GradIo io(a, kArity);
  const Tensor& x = io.need_x(0);
  const Tensor& w = io.need_x(1);
  if (io.dy(0) == nullptr) return zero_outputs(a);
  const Tensor& dy = *io.dy(0);
  const ops::ConvTransposeGeometry g = ops::conv_transpose_geometry(a, x.shape, w.shape);
  ops::expect_dy_shape(a, dy, g.y);
  if (io.wants(0)) expect_shape(a, 0, x.shape);
  if (io.wants(1)) expect_shape(a, 1, w.shape);
  if (io.wants(2)) {
    const Tensor* b = io.x(2);
    if (b == nullptr || b->shape != Shape{g.y[1]})
      fail(ErrorKind::kModel, "ConvTransposeGrad '{}': a bias gradient needs a bias [{}]", a.name,
           g.y[1]);
    expect_shape(a, 2, b->shape);
  }
  if (dy.numel() == 0 || x.numel() == 0) return zero_outputs(a);
  CudaContext& ctx = context(a);
  if (io.wants(0) || io.wants(1)) {
    const CudnnConv c = cudnn_conv(a, ops::conv_of_transpose(g), w.shape);
    const Tensor input = convolution_input(a, c, dy);  // dY, padded where asymmetric
    if (io.wants(0))
      cudnn_conv_forward(a, c, input.as<float>(), w.as<float>(), io.dx(0)->as<float>());
    if (io.wants(1))
      cudnn_conv_backward_filter(a, c, input.as<float>(), x.as<float>(), io.dx(1)->as<float>());
  }
  if (io.wants(2)) {
    const int64_t n = dy.shape[0], m = dy.shape[1];
    launch_channel_sum(dy.as<float>(), io.dx(2)->as<float>(), n, m, dy.numel() / (n * m),
                       ctx.stream());
    check_launch(a);
  }
}

// The CPU backend's checks decide.
const KernelEntry kKernels[] = {
    {"ConvTranspose", conv_transpose, same_as_cpu},
    {"ConvTransposeGrad", conv_transpose_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> conv_transpose_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
