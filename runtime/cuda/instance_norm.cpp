// The CUDA backend's InstanceNormalization and its gradient (families.h), float32, with the
// shared operand checks (runtime/ops/instance_norm_shape.h) and `same_as_cpu`.
//
// Instance normalisation is batch normalisation in training mode of a batch of one whose
// channels are X's N * C planes, with scale and B repeated per sample: so both run on the norm
// family's batch-norm kernels (norm_kernels.cu; statistics in double, one block per plane) on
// copies of scale and B repeated N times. The gradient's per-plane dScale and dB partials are
// then summed over the samples in order, in double (conv_kernels.cu's channel sum).
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/norm_kernels.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/instance_norm_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradArity;
using ops::GradIo;
using ops::zero_outputs;

// `per_channel` ([C]) repeated `n` times into a new [n * C] tensor.
Tensor repeated(const KernelArgs& a, const Tensor& per_channel, int64_t n) {
  CudaContext& ctx = context(a);
  Tensor out = ctx.new_tensor(DType::kFloat32, {n * per_channel.numel()}, false);
  for (int64_t k = 0; k < n; ++k)
    check(cudaMemcpyAsync(out.as<float>() + k * per_channel.numel(), per_channel.data,
                          static_cast<size_t>(per_channel.bytes()), cudaMemcpyDeviceToDevice,
                          ctx.stream()),
          "InstanceNormalization: cudaMemcpyAsync of scale and B");
  return out;
}

// The batch-norm kernels' view of the planes: one sample of N * C channels.
BatchNormArgs planes_as_channels(const KernelArgs& a, const ops::InstanceNormShape& s,
                                 const Tensor& x, const Tensor& scale, const Tensor& bias) {
  BatchNormArgs p;
  p.x = x.as<float>();
  p.scale = scale.as<float>();
  p.bias = bias.as<float>();
  p.n = 1;
  p.c = s.planes();
  p.s = s.size;
  p.epsilon = a.attrs.f("epsilon", 1e-5f);
  return p;
}

void instance_norm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::InstanceNormShape s = ops::instance_norm_shape(a, x, a.input(1), a.input(2));
  expect_shape(a, 0, x.shape);
  if (x.numel() == 0) return;
  const Tensor scale = repeated(a, a.input(1), s.n), bias = repeated(a, a.input(2), s.n);
  launch_batch_norm_training(planes_as_channels(a, s, x, scale, bias), a.out[0]->as<float>(),
                             nullptr, nullptr, context(a).stream());
  check_launch(a);
}

void instance_norm_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kInstanceNormGradArity);
  const Tensor& x = io.need_x(0);
  const Tensor& scale = io.need_x(1);
  const ops::InstanceNormShape s = ops::instance_norm_shape(a, x, scale, io.need_x(2));
  if (io.wants(0)) expect_shape(a, 0, x.shape);
  if (io.wants(1)) expect_shape(a, 1, scale.shape);
  if (io.wants(2)) expect_shape(a, 2, scale.shape);
  if (io.dy(0) == nullptr || x.numel() == 0) return zero_outputs(a);
  ops::expect_dy_shape(a, *io.dy(0), x.shape);
  CudaContext& ctx = context(a);
  const Tensor scales = repeated(a, scale, s.n), biases = repeated(a, io.need_x(2), s.n);
  BatchNormGradArgs q;
  q.forward = planes_as_channels(a, s, x, scales, biases);
  q.training = true;
  q.dy = io.dy(0)->as<float>();
  q.dx = io.wants(0) ? io.dx(0)->as<float>() : nullptr;
  // Per plane, then summed over the samples.
  Tensor dscale, dbias;
  if (io.wants(1)) {
    dscale = ctx.new_tensor(DType::kFloat32, {s.planes()}, false);
    q.dscale = dscale.as<float>();
  }
  if (io.wants(2)) {
    dbias = ctx.new_tensor(DType::kFloat32, {s.planes()}, false);
    q.dbias = dbias.as<float>();
  }
  launch_batch_norm_grad(q, ctx.stream());
  check_launch(a);
  if (io.wants(1)) {
    launch_channel_sum(q.dscale, io.dx(1)->as<float>(), s.n, s.c, 1, ctx.stream());
    check_launch(a);
  }
  if (io.wants(2)) {
    launch_channel_sum(q.dbias, io.dx(2)->as<float>(), s.n, s.c, 1, ctx.stream());
    check_launch(a);
  }
}

// The CPU backend's checks decide.
const KernelEntry kKernels[] = {
    {"InstanceNormalization", instance_norm, same_as_cpu},
    {"InstanceNormalizationGrad", instance_norm_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> instance_norm_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
