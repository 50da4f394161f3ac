// The CUDA backend's gradients of BatchNormalization, LayerNormalization and Softmax
// (families.h), float32 with statistics in double, following the contract of
// runtime/format/grad_ops.h and the formulas of the CPU backend's grad_norm.cpp: statistics are
// recomputed from X, and gradients reaching the forward's optional outputs are included when
// given. Every reduction is a fixed tree or an in-order loop (norm_kernels.cu), so runs are
// reproducible.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "runtime/core/backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/data_kernels.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/norm_kernels.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/norm_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradArity;
using ops::GradIo;

// The operand counts of the gradient ops, as the CPU's.
constexpr GradArity kBatchNormArity{.n_min = 5, .n_max = 5, .m_min = 1, .m_max = 3};
constexpr GradArity kLayerNormArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 3};

void zero_outputs(const KernelArgs& a) {
  for (Tensor* t : a.out)
    if (t != nullptr) a.device.fill_zero(*t);
}

const float* data_or_null(const Tensor* t) { return t != nullptr ? t->as<float>() : nullptr; }
float* data_or_null(Tensor* t) { return t != nullptr ? t->as<float>() : nullptr; }

void batch_norm_grad(const KernelArgs& a) {
  const GradIo io(a, kBatchNormArity);
  const Tensor& x = io.need_x(0);
  if (x.rank() < 2)
    fail(ErrorKind::kShape, "BatchNormalizationGrad: X is {}, expected [N, C, ...]", x.describe());
  BatchNormGradArgs q;
  BatchNormArgs& p = q.forward;
  p.n = x.shape[0];
  p.c = x.shape[1];
  p.s = x.numel() / std::max<int64_t>(p.n * p.c, 1);
  for (size_t k = 1; k < 5; ++k)
    if (a.input(k).shape != Shape{p.c})
      fail(ErrorKind::kShape, "BatchNormalizationGrad: input {} is {}, expected [{}]", k,
           a.input(k).describe(), p.c);
  for (size_t k = 0; k < 5; ++k)
    if (io.wants(k)) expect_shape(a, k, a.input(k).shape);
  // X, dY and dX float32, or one 16-bit type (check_batch_norm_grad); the rest float32.
  p.dtype = x.dtype;
  q.dy = io.dy(0) != nullptr ? io.dy(0)->data : nullptr;
  q.drm = data_or_null(io.dy(1));
  q.drv = data_or_null(io.dy(2));
  if (io.dy(0) && io.dy(0)->shape != x.shape)
    fail(ErrorKind::kShape, "BatchNormalizationGrad: dY {} should be {}", io.dy(0)->describe(),
         shape_string(x.shape));
  q.training = a.attrs.i("training_mode", 0) != 0;
  p.epsilon = a.attrs.f("epsilon", 1e-5f);
  p.momentum = a.attrs.f("momentum", 0.9f);
  p.x = x.data;
  p.scale = a.input(1).as<float>();
  p.bias = a.input(2).as<float>();
  p.mean = a.input(3).as<float>();
  p.var = a.input(4).as<float>();
  q.dx = io.dx(0) != nullptr ? io.dx(0)->data : nullptr;
  q.dscale = data_or_null(io.dx(1));
  q.dbias = data_or_null(io.dx(2));
  q.dmean = data_or_null(io.dx(3));
  q.dvar = data_or_null(io.dx(4));
  if (p.n * p.s == 0) return zero_outputs(a);
  if (!launch_batch_norm_grad(q, context(a).stream()))
    fail(ErrorKind::kUnsupported, "BatchNormalizationGrad '{}': no {} kernel", a.name,
         dtype_name(x.dtype));
  check_launch(a);
}

void layer_norm_grad(const KernelArgs& a) {
  const GradIo io(a, kLayerNormArity);
  const ops::LayerNormGradOperands o = ops::layer_norm_grad_operands(a, io);
  const int64_t outer = o.outer, inner = o.inner;
  if (outer == 0 || inner == 0) return zero_outputs(a);
  const Tensor& x = *o.x;
  const Tensor& scale = *o.scale;
  const Tensor* dy = o.dy;
  const Tensor* dmean = o.dmean;
  const Tensor* dinv = o.dinv;
  CudaContext& ctx = context(a);
  Tensor* dx = io.dx(0);
  Tensor* dscale = io.dx(1);
  Tensor* dbias = io.dx(2);
  const bool columns = (dscale || dbias) && dy;
  if (!dx && !columns) return zero_outputs(a);
  const Tensor mean = ctx.new_tensor(DType::kFloat64, {outer}, false);
  const Tensor inv_std = ctx.new_tensor(DType::kFloat64, {outer}, false);
  cudaStream_t stream = ctx.stream();
  // float32, or one 16-bit type for X, Scale, B, dY and the gradients of the three
  // (check_layer_norm_grad); dMean and dInvStdDev float32.
  const auto raw = [](const Tensor* t) -> void* { return t != nullptr ? t->data : nullptr; };
  const auto unsupported = [&] {
    fail(ErrorKind::kUnsupported, "LayerNormalizationGrad '{}': no {} kernel", a.name,
         dtype_name(x.dtype));
  };
  if (!launch_layer_norm_grad_rows(x.dtype, x.data, scale.data, raw(dy), data_or_null(dmean),
                                   data_or_null(dinv), raw(dx),
                                   const_cast<double*>(mean.as<double>()),
                                   const_cast<double*>(inv_std.as<double>()), outer, inner,
                                   static_cast<double>(a.attrs.f("epsilon", 1e-5f)), stream))
    unsupported();
  check_launch(a);
  if (columns) {
    const int64_t slices = column_slices(outer, inner);
    Tensor partial = ctx.new_tensor(DType::kFloat64, {2 * slices * inner}, false);
    if (!launch_layer_norm_grad_columns(x.dtype, x.data, dy->data, mean.as<double>(),
                                        inv_std.as<double>(), raw(dscale), raw(dbias), outer,
                                        inner, partial.as<double>(), slices, stream))
      unsupported();
    check_launch(a);
  } else {
    // Without dY the column sums are zeros.
    if (dscale) ctx.fill_zero(*dscale);
    if (dbias) ctx.fill_zero(*dbias);
  }
}

void softmax_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kSoftmaxGradArity);
  const auto o = ops::softmax_grad_operands(a, io, [&](Tensor& t) { a.device.fill_zero(t); });
  if (!o) return;
  launch_softmax_grad(o->y->as<float>(), o->dy->as<float>(), o->dx->as<float>(), o->view.outer,
                      o->view.len, o->view.inner, context(a).stream());
  check_launch(a);
}

void log_softmax_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kSoftmaxGradArity);
  const auto o = ops::softmax_grad_operands(a, io, [&](Tensor& t) { a.device.fill_zero(t); });
  if (!o) return;
  launch_log_softmax_grad(o->y->as<float>(), o->dy->as<float>(), o->dx->as<float>(), o->view.outer,
                          o->view.len, o->view.inner, context(a).stream());
  check_launch(a);
}

// BatchNormalizationGrad: the CPU's signatures, and X, Y, dY and dX of one 16-bit type, every
// other operand float32 (or absent): the forward's 5 inputs, its outputs (Y, the running
// statistics) and their gradients, which the CPU runs widened.
std::string check_batch_norm_grad(const OpSignature& s) {
  constexpr size_t n = 5;
  if (s.inputs.size() < n + 2 || (s.inputs.size() - n) % 2 != 0) return same_as_cpu(s);
  const size_t m = (s.inputs.size() - n) / 2;
  return same_as_cpu_16bit_at(s, [m](bool is_output, size_t k) {
    return k == 0 || (!is_output && forward_output_at(k, n, m) == 0);  // X, Y, dY; dX
  });
}

// LayerNormalizationGrad: the CPU's signatures, and X, Scale, B, dY and the gradients dX,
// dScale, dB of one 16-bit type, the forward's Mean and InvStdDev and their gradients float32
// (or absent), which the CPU runs widened.
std::string check_layer_norm_grad(const OpSignature& s) {
  const auto n = static_cast<size_t>(s.attrs.i(std::string(grad::kForwardInputsAttr), 3));
  if (n >= s.inputs.size() || (s.inputs.size() - n) % 2 != 0) return same_as_cpu(s);
  const size_t m = (s.inputs.size() - n) / 2;
  return same_as_cpu_16bit_at(s, [n, m](bool is_output, size_t k) {
    return is_output || forward_output_at(k, n, m) <= 0;  // not Mean, InvStdDev, theirs
  });
}

// The CPU backend's checks decide (float32, the contract's arity, spatial and stash_type);
// besides, BatchNormalizationGrad and LayerNormalizationGrad run 16-bit floats natively.
const KernelEntry kKernels[] = {
    {"BatchNormalizationGrad", batch_norm_grad, check_batch_norm_grad,
     /*writes_every_output=*/true},
    {"LayerNormalizationGrad", layer_norm_grad, check_layer_norm_grad,
     /*writes_every_output=*/true},
    {"SoftmaxGrad", softmax_grad, same_as_cpu, /*writes_every_output=*/true},
    {"LogSoftmaxGrad", log_softmax_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_norm_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
