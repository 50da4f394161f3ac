// Kernels of the norm family (see families.h): BatchNormalization and LayerNormalization on
// float32 through oneDNN's normalisation primitives, and Softmax through oneDNN's softmax.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/norm_shape.h"

namespace stagecraft::rt::cpu {
namespace {

using dnnl::memory;
using dnnl::normalization_flags;

// A oneDNN memory over `data` (not owned) viewed as a dense row-major float32 tensor of `shape`.
memory f32_memory(const Shape& shape, const void* data, const CpuContext& ctx) {
  return memory(plain_desc(shape), ctx.engine, const_cast<void*>(data));
}

// "" when every present input and output is float32.
std::string present_float32(const OpSignature& s) {
  for (DType d : s.inputs)
    if (d != DType::kUndefined && d != DType::kFloat32)
      return fmt::format("{} on {} is not supported (float32 only)", s.op_type, dtype_name(d));
  for (DType d : s.outputs)
    if (d != DType::kUndefined && d != DType::kFloat32)
      return fmt::format("{} producing {} is not supported (float32 only)", s.op_type,
                         dtype_name(d));
  return "";
}

// Number of outputs a node really produces (omitted trailing or empty-named ones excluded).
size_t present_outputs(const OpSignature& s) {
  size_t count = 0;
  for (DType d : s.outputs) count += d != DType::kUndefined;
  return count;
}

// A per-channel input of BatchNormalization must be a vector of C values.
const Tensor& channel_input(const KernelArgs& a, size_t k, const char* what, int64_t channels) {
  const Tensor& t = a.input(k);
  if (t.numel() != channels || t.rank() != 1)
    fail(ErrorKind::kShape, "BatchNormalization: {} is {}, expected [{}]", what, t.describe(),
         channels);
  return t;
}

std::string check_batch_norm(const OpSignature& s) {
  if (std::string why = present_float32(s); !why.empty()) return why;
  if (s.attrs.i("spatial", 1) == 0)
    return "BatchNormalization with spatial=0 (opset < 9) is not supported";
  bool training = s.attrs.i("training_mode", 0) != 0;
  if (!training && present_outputs(s) > 1)
    return "BatchNormalization's training outputs without training_mode=1 (opsets < 14: mean, var, "
           "saved_mean, "
           "saved_var) are not supported";
  if (training && s.outputs.size() > 3)
    return "BatchNormalization with training_mode=1 has at most 3 outputs";
  return "";
}

// BatchNormalization. Inference (the default, and opsets < 14 with one output, as ONNX Runtime
// reads them whatever is_test says) normalises with the given mean and var. training_mode=1
// (opset 14+) normalises with the batch's own mean and (biased) variance and writes the running
// statistics input * momentum + batch * (1 - momentum) to the optional outputs 1 and 2.
// X [N, C, D1, ...] is seen by oneDNN as [N, C, D1 * ..., 1].
void batch_norm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  if (x.rank() < 2)
    fail(ErrorKind::kShape, "BatchNormalization: X is {}, expected [N, C, ...]", x.describe());
  const int64_t n = x.shape[0], c = x.shape[1], spatial = x.numel() / std::max<int64_t>(n * c, 1);
  const Tensor& scale = channel_input(a, 1, "scale", c);
  const Tensor& bias = channel_input(a, 2, "B", c);
  const Tensor& mean = channel_input(a, 3, "input_mean", c);
  const Tensor& var = channel_input(a, 4, "input_var", c);
  expect_shape(a, 0, x.shape);
  const bool training = a.attrs.i("training_mode", 0) != 0;
  if (x.numel() == 0) {
    if (training)
      fail(ErrorKind::kUnsupported, "BatchNormalization: training_mode=1 on an empty batch");
    return;
  }

  const CpuContext& ctx = context(a);
  // 4-D [N, C, D, 1]: oneDNN has optimised batch norm for nchw but only a reference one for 3-D.
  const Shape data_shape{n, c, spatial, 1};
  auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
  if (!training) flags |= normalization_flags::use_global_stats;
  dnnl::batch_normalization_forward::desc desc(
      training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
      plain_desc(data_shape), a.attrs.f("epsilon", 1e-5f), flags);
  dnnl::batch_normalization_forward::primitive_desc pd(desc, ctx.engine);

  // Inference reads the given statistics; training writes the batch's into these.
  std::vector<float> batch_mean(training ? c : 0), batch_var(training ? c : 0);
  memory mean_mem =
      f32_memory({c}, training ? static_cast<void*>(batch_mean.data()) : mean.data, ctx);
  memory var_mem = f32_memory({c}, training ? static_cast<void*>(batch_var.data()) : var.data, ctx);
  dnnl::stream stream = ctx.stream;
  dnnl::batch_normalization_forward(pd).execute(
      stream, {{DNNL_ARG_SRC, f32_memory(data_shape, x.data, ctx)},
               {DNNL_ARG_DST, f32_memory(data_shape, a.out[0]->data, ctx)},
               {DNNL_ARG_SCALE, f32_memory({c}, scale.data, ctx)},
               {DNNL_ARG_SHIFT, f32_memory({c}, bias.data, ctx)},
               {DNNL_ARG_MEAN, mean_mem},
               {DNNL_ARG_VARIANCE, var_mem}});
  stream.wait();
  if (!training) return;

  const float momentum = a.attrs.f("momentum", 0.9f);
  auto running = [&](size_t k, const Tensor& given, const std::vector<float>& batch) {
    if (k >= a.out.size() || !a.out[k]) return;
    expect_shape(a, k, {c});
    float* dst = a.out[k]->as<float>();
    for (int64_t i = 0; i < c; ++i)
      dst[i] = given.as<float>()[i] * momentum + batch[i] * (1.0f - momentum);
  };
  running(1, mean, batch_mean);
  running(2, var, batch_var);
}

std::string check_layer_norm(const OpSignature& s) {
  if (std::string why = present_float32(s); !why.empty()) return why;
  if (s.attrs.i("stash_type", 1) != 1)
    return fmt::format("LayerNormalization with stash_type={} is not supported (1, float32, only)",
                       s.attrs.i("stash_type", 1));
  return "";
}

// LayerNormalization (opset 17): normalises X over its dims from `axis` on, i.e. as the 2-D
// [prod(dims before axis), prod(dims from axis)] that oneDNN normalises over its last dim, then
// applies Scale and the optional B (each of the normalised shape). The optional outputs Mean
// and InvStdDev ([dims before axis, 1, ...]) come from the training-mode statistics. The
// operands are read by norm_shape.h's rules, which the CUDA kernel shares.
void layer_norm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::LayerNormOperands o = ops::layer_norm_operands(a);
  if (o.outer == 0) return;
  const int64_t outer = o.outer, inner = o.inner;
  const Tensor* scale = o.scale;
  const Tensor* bias = o.bias;
  Tensor* mean_out = o.mean;
  Tensor* inv_std_out = o.inv_std;

  const CpuContext& ctx = context(a);
  const float epsilon = a.attrs.f("epsilon", 1e-5f);
  const bool stats = mean_out || inv_std_out;
  const Shape data_shape{outer, inner};
  auto flags = normalization_flags::use_scale;
  if (bias) flags |= normalization_flags::use_shift;
  dnnl::layer_normalization_forward::desc desc(
      stats ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
      plain_desc(data_shape), plain_desc({outer}), epsilon, flags);
  dnnl::layer_normalization_forward::primitive_desc pd(desc, ctx.engine);

  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, f32_memory(data_shape, x.data, ctx)},
                                       {DNNL_ARG_DST, f32_memory(data_shape, a.out[0]->data, ctx)},
                                       {DNNL_ARG_SCALE, f32_memory({inner}, scale->data, ctx)}};
  if (bias) args[DNNL_ARG_SHIFT] = f32_memory({inner}, bias->data, ctx);
  // The mean goes straight to its output; the variance to InvStdDev, inverted in place below.
  std::vector<float> scratch_mean, scratch_var;
  if (stats) {
    if (!mean_out) scratch_mean.resize(outer);
    if (!inv_std_out) scratch_var.resize(outer);
    args[DNNL_ARG_MEAN] = f32_memory(
        {outer}, mean_out ? mean_out->data : static_cast<void*>(scratch_mean.data()), ctx);
    args[DNNL_ARG_VARIANCE] = f32_memory(
        {outer}, inv_std_out ? inv_std_out->data : static_cast<void*>(scratch_var.data()), ctx);
  }
  dnnl::stream stream = ctx.stream;
  dnnl::layer_normalization_forward(pd).execute(stream, args);
  stream.wait();
  if (inv_std_out) {
    float* v = inv_std_out->as<float>();
    for (int64_t i = 0; i < outer; ++i) v[i] = 1.0f / std::sqrt(v[i] + epsilon);
  }
}

// Softmax along its one axis (ops::softmax_view), seen by oneDNN as [outer, len] or
// [outer, len, inner].
void softmax(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::SoftmaxView v = ops::softmax_view(a, x);
  if (x.numel() == 0) return;
  const Shape view = v.inner == 1 ? Shape{v.outer, v.len} : Shape{v.outer, v.len, v.inner};

  const CpuContext& ctx = context(a);
  dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, plain_desc(view), 1);
  dnnl::softmax_forward::primitive_desc pd(desc, ctx.engine);
  dnnl::stream stream = ctx.stream;
  dnnl::softmax_forward(pd).execute(
      stream, {{DNNL_ARG_SRC, memory(plain_desc(view), ctx.engine, x.data)},
               {DNNL_ARG_DST, memory(plain_desc(view), ctx.engine, a.out[0]->data)}});
  stream.wait();
}

// LogSoftmax: y = x - max - log(sum(exp(x - max))) along the axis, the sum in double.
void log_softmax(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::SoftmaxView v = ops::softmax_view(a, x);
  const int64_t outer = v.outer, len = v.len, inner = v.inner;
  const float* xp = x.as<float>();
  float* yp = a.out[0]->as<float>();
#pragma omp parallel for if (x.numel() > 32768)
  for (int64_t r = 0; r < outer * inner; ++r) {
    const int64_t base = (r / inner) * len * inner + r % inner;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t k = 0; k < len; ++k) top = std::max(top, xp[base + k * inner]);
    double sum = 0;
    for (int64_t k = 0; k < len; ++k)
      sum += std::exp(static_cast<double>(xp[base + k * inner]) - top);
    const float shift = top + static_cast<float>(std::log(sum));
    for (int64_t k = 0; k < len; ++k) yp[base + k * inner] = xp[base + k * inner] - shift;
  }
}

const KernelEntry kKernels[] = {
    {"BatchNormalization", batch_norm, check_batch_norm},
    {"LayerNormalization", layer_norm, check_layer_norm},
    {"Softmax", softmax, all_float32},
    {"LogSoftmax", log_softmax, all_float32},
};

}  // namespace

std::span<const KernelEntry> norm_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
