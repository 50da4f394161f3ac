// The CUDA backend's norm family (families.h): BatchNormalization (inference, and
// training_mode=1 with its running statistics), LayerNormalization (with its optional Mean and
// InvStdDev outputs) and Softmax, float32 (BatchNormalization's X and Y and LayerNormalization
// also 16-bit), with the attributes, defaults and shape checks of
// the CPU backend's norm.cpp and reduce.cpp. The kernels are norm_kernels.cu.
#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <string>

#include "runtime/core/backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/norm_kernels.h"
#include "runtime/format/error.h"
#include "runtime/ops/norm_shape.h"

namespace stagecraft::rt::cuda {
namespace {

// A per-channel input of BatchNormalization must be a vector of C values.
const Tensor& channel_input(const KernelArgs& a, size_t k, const char* what, int64_t channels) {
  const Tensor& t = a.input(k);
  if (t.numel() != channels || t.rank() != 1)
    fail(ErrorKind::kShape, "BatchNormalization: {} is {}, expected [{}]", what, t.describe(),
         channels);
  return t;
}

// BatchNormalization over X [N, C, D1, ...] read as [N, C, S].
void batch_norm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  if (x.rank() < 2)
    fail(ErrorKind::kShape, "BatchNormalization: X is {}, expected [N, C, ...]", x.describe());
  BatchNormArgs p;
  p.n = x.shape[0];
  p.c = x.shape[1];
  p.s = x.numel() / std::max<int64_t>(p.n * p.c, 1);
  // X and Y float32, or one 16-bit type (check_batch_norm); the rest float32.
  p.dtype = x.dtype;
  p.x = x.data;
  p.scale = channel_input(a, 1, "scale", p.c).as<float>();
  p.bias = channel_input(a, 2, "B", p.c).as<float>();
  const Tensor& mean = channel_input(a, 3, "input_mean", p.c);
  const Tensor& var = channel_input(a, 4, "input_var", p.c);
  p.mean = mean.as<float>();
  p.var = var.as<float>();
  p.epsilon = a.attrs.f("epsilon", 1e-5f);
  p.momentum = a.attrs.f("momentum", 0.9f);
  expect_shape(a, 0, x.shape);
  const bool training = a.attrs.i("training_mode", 0) != 0;
  if (x.numel() == 0) {
    if (training)
      fail(ErrorKind::kUnsupported, "BatchNormalization: training_mode=1 on an empty batch");
    return;
  }
  cudaStream_t stream = context(a).stream();
  void* y = a.out[0]->data;
  const auto unsupported = [&] {
    fail(ErrorKind::kUnsupported, "BatchNormalization '{}': no {} kernel", a.name,
         dtype_name(x.dtype));
  };
  if (!training) {
    if (!launch_batch_norm_inference(p, y, stream)) unsupported();
    return check_launch(a);
  }
  auto running = [&](size_t k) -> float* {
    if (k >= a.out.size() || !a.out[k]) return nullptr;
    expect_shape(a, k, {p.c});
    return a.out[k]->as<float>();
  };
  float* running_mean = running(1);
  float* running_var = running(2);
  if (!launch_batch_norm_training(p, y, running_mean, running_var, stream)) unsupported();
  check_launch(a);
}

// LayerNormalization (opset 17): X normalised over its dims from `axis` on, then Scale and the
// optional B; the optional Mean and InvStdDev outputs ([dims before axis, 1, ...]). The
// operands are read by the shared rules (runtime/ops/norm_shape.h).
void layer_norm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::LayerNormOperands o = ops::layer_norm_operands(a);
  if (o.outer == 0) return;
  // float32, or one 16-bit type for X, Scale, B and Y (check_layer_norm); Mean and InvStdDev
  // float32.
  if (!launch_layer_norm(x.dtype, x.data, o.scale->data, o.bias ? o.bias->data : nullptr,
                         a.out[0]->data, o.mean ? o.mean->as<float>() : nullptr,
                         o.inv_std ? o.inv_std->as<float>() : nullptr, o.outer, o.inner,
                         a.attrs.f("epsilon", 1e-5f), context(a).stream()))
    fail(ErrorKind::kUnsupported, "LayerNormalization '{}': no {} kernel", a.name,
         dtype_name(x.dtype));
  check_launch(a);
}

// BatchNormalization: the CPU's signatures, and X and Y of one 16-bit type with float32 Scale, B,
// statistics and running statistics (a mixed plan from opset 15 on), which the CPU runs widened.
std::string check_batch_norm(const OpSignature& s) {
  return same_as_cpu_16bit_at(s, [](bool, size_t k) { return k == 0; });
}

// LayerNormalization: the CPU's signatures, and X, Scale, B and Y of one 16-bit type with
// float32 (or absent) Mean and InvStdDev, which the CPU runs widened.
std::string check_layer_norm(const OpSignature& s) {
  return same_as_cpu_16bit_at(s, [](bool is_output, size_t k) { return !is_output || k == 0; });
}

// Softmax along its one axis (ops::softmax_view), as the CPU's.
void softmax(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::SoftmaxView v = ops::softmax_view(a, x);
  if (x.numel() == 0) return;
  launch_softmax(x.as<float>(), a.out[0]->as<float>(), v.outer, v.len, v.inner,
                 context(a).stream());
  check_launch(a);
}

void log_softmax(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::SoftmaxView v = ops::softmax_view(a, x);
  if (x.numel() == 0) return;
  launch_log_softmax(x.as<float>(), a.out[0]->as<float>(), v.outer, v.len, v.inner,
                     context(a).stream());
  check_launch(a);
}

// The CPU backend's checks decide: the same dtypes (float32), attributes and outputs; besides,
// BatchNormalization and LayerNormalization run 16-bit floats natively.
const KernelEntry kKernels[] = {
    {"BatchNormalization", batch_norm, check_batch_norm},
    {"LayerNormalization", layer_norm, check_layer_norm},
    {"Softmax", softmax, same_as_cpu},
    {"LogSoftmax", log_softmax, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> norm_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
