// InstanceNormalization and its gradient on float32 (operands: instance_norm_shape.h), one
// OpenMP task per (n, c) plane. The statistics are the plane's mean and biased variance in
// double (two passes); Y = scale * ((x - mean) * inv) + B in float with mean, var and inv =
// 1 / sqrt(var + epsilon) as float, as the CUDA backend's (its batch-norm training kernel run
// on the N * C planes).
//
// InstanceNormalizationGrad (xhat = (x - mean) * istd, istd in double):
//   dX = scale * istd * (dY - mean(dY) - xhat * mean(dY * xhat)) over the plane,
//   dScale[c] = sum over n and the plane of dY * xhat, dB[c] = the same of dY,
// the per-plane sums in double, summed over n in order.
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/families.h"
#include "runtime/cpu/vectorise.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/instance_norm_shape.h"

namespace stagecraft::rt::cpu {

// The loops over a plane are built per vector unit (STAGECRAFT_CPU_CLONES): plain C++ loops
// over doubles ran a scalar operation per element.

STAGECRAFT_CPU_CLONES void mean_and_variance(const float* x, int64_t size, double& mean,
                                             double& var) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < size; ++i) sum += x[i];
  mean = sum / static_cast<double>(size);
  double sq = 0;
#pragma omp simd reduction(+ : sq)
  for (int64_t i = 0; i < size; ++i) {
    const double d = x[i] - mean;
    sq += d * d;
  }
  var = sq / static_cast<double>(size);
}

namespace {

// out = k * ((in - mean) * inv) + b over a plane.
STAGECRAFT_CPU_CLONES void normalise_plane(const float* in, float* out, int64_t size, float mean,
                                           float inv, float k, float b) {
#pragma omp simd
  for (int64_t i = 0; i < size; ++i) out[i] = k * ((in[i] - mean) * inv) + b;
}

// A plane's sums of dY and dY * xhat, and its dX (when `out` is not null).
STAGECRAFT_CPU_CLONES void instance_norm_grad_plane(const float* in, const float* g, int64_t size,
                                                    double epsilon, double scale, float* out,
                                                    double& sum_dy, double& sum_dy_xhat) {
  double mean, var;
  mean_and_variance(in, size, mean, var);
  const double istd = 1.0 / std::sqrt(var + epsilon);
  double sdy = 0, sdyx = 0;
#pragma omp simd reduction(+ : sdy, sdyx)
  for (int64_t i = 0; i < size; ++i) {
    sdy += g[i];
    sdyx += g[i] * (in[i] - mean) * istd;
  }
  sum_dy = sdy;
  sum_dy_xhat = sdyx;
  if (out == nullptr) return;
  const double k = scale * istd, inv_size = 1.0 / static_cast<double>(size);
  const double mean_dy = sdy * inv_size, slope = istd * sdyx * inv_size;
#pragma omp simd
  for (int64_t i = 0; i < size; ++i)
    out[i] = static_cast<float>(k * (g[i] - mean_dy - (in[i] - mean) * slope));
}

void instance_norm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::InstanceNormShape s = ops::instance_norm_shape(a, x, a.input(1), a.input(2));
  expect_shape(a, 0, x.shape);
  if (x.numel() == 0) return;
  const float epsilon = a.attrs.f("epsilon", 1e-5f);
  const float* xp = x.as<float>();
  const float* scale = a.input(1).as<float>();
  const float* bias = a.input(2).as<float>();
  float* y = a.out[0]->as<float>();
#pragma omp parallel for if (x.numel() > 32768)
  for (int64_t p = 0; p < s.planes(); ++p) {
    const float* in = xp + p * s.size;
    float* out = y + p * s.size;
    double mean, var;
    mean_and_variance(in, s.size, mean, var);
    const float mean_f = static_cast<float>(mean), var_f = static_cast<float>(var);
    const float inv = 1.0f / std::sqrt(var_f + epsilon);
    normalise_plane(in, out, s.size, mean_f, inv, scale[p % s.c], bias[p % s.c]);
  }
}

// Writes every element of every requested output.
void instance_norm_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kInstanceNormGradArity);
  const Tensor& x = io.need_x(0);
  const Tensor& scale_t = io.need_x(1);
  const ops::InstanceNormShape s = ops::instance_norm_shape(a, x, scale_t, io.need_x(2));
  if (io.wants(0)) expect_shape(a, 0, x.shape);
  if (io.wants(1)) expect_shape(a, 1, scale_t.shape);
  if (io.wants(2)) expect_shape(a, 2, scale_t.shape);
  if (io.dy(0) == nullptr || x.numel() == 0) return ops::zero_outputs(a);
  const Tensor& dy_t = *io.dy(0);
  ops::expect_dy_shape(a, dy_t, x.shape);
  const double epsilon = a.attrs.f("epsilon", 1e-5f);
  const float* xp = x.as<float>();
  const float* dyp = dy_t.as<float>();
  const float* scale = scale_t.as<float>();
  float* dx = io.wants(0) ? io.dx(0)->as<float>() : nullptr;
  // Per plane: the sums of dY and of dY * xhat.
  std::vector<double> sum_dy(static_cast<size_t>(s.planes())), sum_dy_xhat(sum_dy.size());
#pragma omp parallel for if (x.numel() > 32768)
  for (int64_t p = 0; p < s.planes(); ++p)
    instance_norm_grad_plane(xp + p * s.size, dyp + p * s.size, s.size, epsilon, scale[p % s.c],
                             dx ? dx + p * s.size : nullptr, sum_dy[static_cast<size_t>(p)],
                             sum_dy_xhat[static_cast<size_t>(p)]);
  for (size_t k : {size_t{1}, size_t{2}}) {
    if (!io.wants(k)) continue;
    const std::vector<double>& sums = k == 1 ? sum_dy_xhat : sum_dy;
    float* out = io.dx(k)->as<float>();
    for (int64_t c = 0; c < s.c; ++c) {
      double total = 0;
      for (int64_t n = 0; n < s.n; ++n) total += sums[static_cast<size_t>(n * s.c + c)];
      out[c] = static_cast<float>(total);
    }
  }
}

std::string check_instance_norm(const OpSignature& s) {
  if (s.inputs.size() != 3 || s.inputs[0] == DType::kUndefined ||
      s.inputs[1] == DType::kUndefined || s.inputs[2] == DType::kUndefined)
    return "InstanceNormalization needs its three inputs: input, scale and B";
  return all_float32(s);
}

std::string check_instance_norm_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, ops::kInstanceNormGradArity); !why.empty()) return why;
  return all_float32(s);
}

constexpr KernelEntry kKernels[] = {
    {"InstanceNormalization", instance_norm, check_instance_norm},
    {"InstanceNormalizationGrad", instance_norm_grad, check_instance_norm_grad,
     /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> instance_norm_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
