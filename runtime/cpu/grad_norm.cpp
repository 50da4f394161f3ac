// Gradients of BatchNormalization, LayerNormalization and Softmax, in plain C++ on float32
// (statistics in double). The contract every gradient kernel follows is
// runtime/format/grad_ops.h: inputs x0..x{n-1}, y0..y{m-1}, dy0..dy{m-1}; outputs dx0..dx{n-1}.
//
// Statistics are recomputed from X (the forward's optional statistic outputs may be absent).
// Gradients reaching the forward's optional outputs (BatchNormalization's running mean and
// variance, LayerNormalization's Mean and InvStdDev) are included when given.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/vectorise.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/norm_shape.h"

namespace stagecraft::rt::cpu {
namespace {

// The gradient ops' operand counts: n forward inputs, m forward outputs (BatchNormalization's Y,
// running mean and running variance; LayerNormalization's Y, Mean and InvStdDev).
constexpr ops::GradArity kBatchNormArity{.n_min = 5, .n_max = 5, .m_min = 1, .m_max = 3};
constexpr ops::GradArity kLayerNormArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 3};

// ---------------------------------------------------------------------------------------------
// BatchNormalizationGrad: X [N, C, ...] read as [N, C, S].

// A BatchNormalizationGrad's operands, X read as [N, C, S]; null where not given or not wanted.
struct BatchNormGrad {
  int64_t N, C, S;
  bool training;
  float eps, momentum;
  const float *x, *scale, *in_mean, *in_var, *dy, *drm, *drv;
  float *dx, *dscale, *dbias, *dmean, *dvar;
};

// Channel c's gradients. Sums in double, over each image's contiguous plane of S elements in
// loops vectorised per vector unit (plain C++ loops over doubles ran a scalar operation per
// element).
STAGECRAFT_CPU_CLONES void batch_norm_grad_channel(const BatchNormGrad& p, int64_t c) {
  const int64_t N = p.N, S = p.S, count = N * S;
  auto plane = [&](int64_t b) { return (b * p.C + c) * S; };
  double mu, var;
  if (p.training) {
    double sum = 0;
    for (int64_t b = 0; b < N; ++b) {
      const float* xs = p.x + plane(b);
#pragma omp simd reduction(+ : sum)
      for (int64_t s = 0; s < S; ++s) sum += xs[s];
    }
    mu = sum / static_cast<double>(count);
    double sq = 0;
    for (int64_t b = 0; b < N; ++b) {
      const float* xs = p.x + plane(b);
#pragma omp simd reduction(+ : sq)
      for (int64_t s = 0; s < S; ++s) {
        const double d = xs[s] - mu;
        sq += d * d;
      }
    }
    var = sq / static_cast<double>(count);
  } else {
    mu = p.in_mean[c];
    var = p.in_var[c];
  }
  const double istd = 1.0 / std::sqrt(var + static_cast<double>(p.eps));
  double sum_dy = 0, sum_dy_xhat = 0;
  if (p.dy)
    for (int64_t b = 0; b < N; ++b) {
      const float* xs = p.x + plane(b);
      const float* gs = p.dy + plane(b);
#pragma omp simd reduction(+ : sum_dy, sum_dy_xhat)
      for (int64_t s = 0; s < S; ++s) {
        sum_dy += gs[s];
        sum_dy_xhat += gs[s] * (xs[s] - mu) * istd;
      }
    }
  if (p.dbias) p.dbias[c] = static_cast<float>(sum_dy);
  if (p.dscale) p.dscale[c] = static_cast<float>(sum_dy_xhat);
  const double k = p.scale[c] * istd;
  if (p.training) {
    // Running statistics: input * momentum + batch * (1 - momentum).
    const double rm = p.drm ? p.drm[c] : 0.0, rv = p.drv ? p.drv[c] : 0.0;
    if (p.dmean) p.dmean[c] = static_cast<float>(p.momentum * rm);
    if (p.dvar) p.dvar[c] = static_cast<float>(p.momentum * rv);
    if (!p.dx) return;
    const double inv = 1.0 / static_cast<double>(count), keep = 1.0 - p.momentum;
    const double mean_dy = sum_dy * inv, slope = istd * sum_dy_xhat * inv;
    for (int64_t b = 0; b < N; ++b) {
      const float* xs = p.x + plane(b);
      float* out = p.dx + plane(b);
      if (p.dy) {
        const float* gs = p.dy + plane(b);
#pragma omp simd
        for (int64_t s = 0; s < S; ++s) {
          const double xc = xs[s] - mu;
          out[s] = static_cast<float>(keep * inv * (rm + 2.0 * rv * xc) +
                                      k * (gs[s] - mean_dy - xc * slope));
        }
      } else {
#pragma omp simd
        for (int64_t s = 0; s < S; ++s)
          out[s] = static_cast<float>(keep * inv * (rm + 2.0 * rv * (xs[s] - mu)));
      }
    }
  } else {
    if (p.dx)
      for (int64_t b = 0; b < N; ++b) {
        float* out = p.dx + plane(b);
        if (!p.dy) {
          std::fill(out, out + S, 0.0f);
          continue;
        }
        const float* gs = p.dy + plane(b);
#pragma omp simd
        for (int64_t s = 0; s < S; ++s) out[s] = static_cast<float>(gs[s] * k);
      }
    if (p.dmean) p.dmean[c] = static_cast<float>(-k * sum_dy);
    if (p.dvar) p.dvar[c] = static_cast<float>(-0.5 * p.scale[c] * istd * istd * sum_dy_xhat);
  }
}

// Writes every element of the outputs it is given: one value per channel for the [C] gradients
// and, per channel, every element of dX (zeros in inference without dY).
void batch_norm_grad(const KernelArgs& a) {
  const ops::GradIo io(a, kBatchNormArity);
  const Tensor& x = io.need_x(0);
  if (x.rank() < 2)
    fail(ErrorKind::kShape, "BatchNormalizationGrad: X is {}, expected [N, C, ...]", x.describe());
  const int64_t N = x.shape[0], C = x.shape[1], S = x.numel() / std::max<int64_t>(N * C, 1);
  for (size_t k = 1; k < 5; ++k)
    if (a.input(k).shape != Shape{C})
      fail(ErrorKind::kShape, "BatchNormalizationGrad: input {} is {}, expected [{}]", k,
           a.input(k).describe(), C);
  for (size_t k = 0; k < 5; ++k)
    if (io.wants(k)) expect_shape(a, k, a.input(k).shape);
  const Tensor* dy = io.dy(0);
  const Tensor* drm = io.dy(1);  // running mean
  const Tensor* drv = io.dy(2);  // running var
  if (dy && dy->shape != x.shape)
    fail(ErrorKind::kShape, "BatchNormalizationGrad: dY {} should be {}", dy->describe(),
         shape_string(x.shape));
  const bool training = a.attrs.i("training_mode", 0) != 0;
  const float eps = a.attrs.f("epsilon", 1e-5f), momentum = a.attrs.f("momentum", 0.9f);
  const float* xp = x.as<float>();
  const float* scale = a.input(1).as<float>();
  const float* in_mean = a.input(3).as<float>();
  const float* in_var = a.input(4).as<float>();
  const float* g = dy ? dy->as<float>() : nullptr;
  float* dx = io.wants(0) ? io.dx(0)->as<float>() : nullptr;
  float* dscale = io.wants(1) ? io.dx(1)->as<float>() : nullptr;
  float* dbias = io.wants(2) ? io.dx(2)->as<float>() : nullptr;
  float* dmean = io.wants(3) ? io.dx(3)->as<float>() : nullptr;
  float* dvar = io.wants(4) ? io.dx(4)->as<float>() : nullptr;
  const int64_t count = N * S;
  if (count == 0) return ops::zero_outputs(a);
  const BatchNormGrad p{N,
                        C,
                        S,
                        training,
                        eps,
                        momentum,
                        xp,
                        scale,
                        in_mean,
                        in_var,
                        g,
                        drm ? drm->as<float>() : nullptr,
                        drv ? drv->as<float>() : nullptr,
                        dx,
                        dscale,
                        dbias,
                        dmean,
                        dvar};
#pragma omp parallel for if (x.numel() > 32768)
  for (int64_t c = 0; c < C; ++c) batch_norm_grad_channel(p, c);
}

std::string check_batch_norm_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, kBatchNormArity); !why.empty()) return why;
  if (std::string why = all_float32(s); !why.empty()) return why;
  if (s.attrs.i("spatial", 1) == 0)
    return "BatchNormalization with spatial=0 (opset < 9) is not supported";
  return "";
}

// ---------------------------------------------------------------------------------------------
// LayerNormalizationGrad: X read as [outer, inner] (inner: the dims from axis on).

// One row of LayerNormalizationGrad: the row's mean and 1 / std (into `mean`, `istd`) and, when
// `out` is not null, its dX. Sums in double, in loops vectorised per vector unit (plain C++
// loops over doubles ran a scalar operation per element: 17x the forward on a GPT's rows).
STAGECRAFT_CPU_CLONES void layer_norm_grad_row(const float* row, const float* g, const float* sc,
                                               int64_t inner, double eps, double dm, double di,
                                               float* out, double& mean, double& istd) {
  double mu, var;
  mean_and_variance(row, inner, mu, var);
  mean = mu;
  const double is = 1.0 / std::sqrt(var + eps);
  istd = is;
  if (!out) return;
  const double inv = 1.0 / static_cast<double>(inner);
  double mg = 0, mgx = 0;  // mean(dy * scale), mean(dy * scale * xhat)
  if (g) {
#pragma omp simd reduction(+ : mg, mgx)
    for (int64_t j = 0; j < inner; ++j) {
      const double gj = static_cast<double>(g[j]) * sc[j];
      mg += gj;
      mgx += gj * (row[j] - mu) * is;
    }
  }
  mg *= inv;
  mgx *= inv;
  const double base = dm * inv, slope = di * is * is * is * inv;
  if (g) {
#pragma omp simd
    for (int64_t j = 0; j < inner; ++j) {
      const double xc = row[j] - mu;
      out[j] = static_cast<float>(base - slope * xc +
                                  is * (static_cast<double>(g[j]) * sc[j] - mg - xc * is * mgx));
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < inner; ++j) out[j] = static_cast<float>(base - slope * (row[j] - mu));
  }
}

// Adds one row's terms of dScale (part[0, inner)) and dB (part[inner, 2 inner)).
STAGECRAFT_CPU_CLONES void layer_norm_grad_columns(const float* row, const float* g, double mean,
                                                   double istd, int64_t inner, double* part) {
  double* dscale = part;
  double* dbias = part + inner;
#pragma omp simd
  for (int64_t j = 0; j < inner; ++j) {
    dscale[j] += g[j] * (row[j] - mean) * istd;
    dbias[j] += g[j];
  }
}

// Writes every element of the outputs it is given: every row of dX, and every column sum of
// dScale and dB (zeros without dY).
void layer_norm_grad(const KernelArgs& a) {
  const ops::GradIo io(a, kLayerNormArity);
  const ops::LayerNormGradOperands o = ops::layer_norm_grad_operands(a, io);
  const int64_t outer = o.outer, inner = o.inner;
  if (outer == 0 || inner == 0) return ops::zero_outputs(a);
  const Tensor& x = *o.x;
  const Tensor& scale = *o.scale;
  const Tensor* dy = o.dy;
  const Tensor* dmean = o.dmean;
  const Tensor* dinv = o.dinv;
  const double eps = a.attrs.f("epsilon", 1e-5f);
  const float* xp = x.as<float>();
  const float* sc = scale.as<float>();
  const float* g = dy ? dy->as<float>() : nullptr;
  float* dx = io.wants(0) ? io.dx(0)->as<float>() : nullptr;
  float* dscale = io.wants(1) ? io.dx(1)->as<float>() : nullptr;
  float* dbias = io.wants(2) ? io.dx(2)->as<float>() : nullptr;
  std::vector<double> mean(static_cast<size_t>(outer)), istd(static_cast<size_t>(outer));
  const bool parallel = x.numel() > 32768;
#pragma omp parallel for if (parallel)
  for (int64_t r = 0; r < outer; ++r) {
    const double dm = dmean ? dmean->as<float>()[r] : 0.0, di = dinv ? dinv->as<float>()[r] : 0.0;
    layer_norm_grad_row(xp + r * inner, g ? g + r * inner : nullptr, sc, inner, eps, dm, di,
                        dx ? dx + r * inner : nullptr, mean[r], istd[r]);
  }
  if (dscale || dbias) {
    // Column sums over rows (zeros without dY): each thread sums its rows into its own partial
    // sums, which are then added in thread order, so a run's sums do not depend on timing.
    std::vector<double> total(static_cast<size_t>(2 * inner), 0.0);
    std::vector<std::vector<double>> parts;
    if (g) {
#pragma omp parallel if (parallel)
      {
#pragma omp single
        parts.resize(static_cast<size_t>(omp_get_num_threads()));
        std::vector<double>& part = parts[static_cast<size_t>(omp_get_thread_num())];
        part.assign(static_cast<size_t>(2 * inner), 0.0);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < outer; ++r)
          layer_norm_grad_columns(xp + r * inner, g + r * inner, mean[r], istd[r], inner,
                                  part.data());
      }
    }
    for (const std::vector<double>& part : parts)
      for (int64_t j = 0; j < 2 * inner; ++j) total[j] += part[j];
    for (int64_t j = 0; j < inner; ++j) {
      if (dscale) dscale[j] = static_cast<float>(total[j]);
      if (dbias) dbias[j] = static_cast<float>(total[inner + j]);
    }
  }
}

std::string check_layer_norm_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, kLayerNormArity); !why.empty()) return why;
  if (std::string why = all_float32(s); !why.empty()) return why;
  if (s.attrs.i("stash_type", 1) != 1)
    return "LayerNormalization with stash_type other than 1 is not supported";
  return "";
}

// ---------------------------------------------------------------------------------------------
// SoftmaxGrad (opset 13, one axis): dx = y * (dy - sum(dy * y, axis)).

// One row of consecutive elements: dx = y * (dy - sum(dy * y)), the sum in double, in loops
// vectorised per vector unit.
STAGECRAFT_CPU_CLONES void softmax_grad_row(const float* y, const float* g, int64_t len,
                                            float* dx) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < len; ++k) s += static_cast<double>(g[k]) * y[k];
  const float sf = static_cast<float>(s);
#pragma omp simd
  for (int64_t k = 0; k < len; ++k) dx[k] = y[k] * (g[k] - sf);
}

// Writes every element of dX.
void softmax_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kSoftmaxGradArity);
  const auto operands = ops::softmax_grad_operands(a, io, [](Tensor& t) { ops::zero(t); });
  if (!operands) return;
  // Named values, not a structured binding: clang 14 (the fuzzing build) takes none into the
  // OpenMP regions below.
  const int64_t outer = operands->view.outer, len = operands->view.len,
                inner = operands->view.inner, numel = operands->y->numel();
  const float* yp = operands->y->as<float>();
  const float* g = operands->dy->as<float>();
  float* dx = operands->dx->as<float>();
  if (inner == 1) {  // the last axis (attention's scores): rows of consecutive elements
#pragma omp parallel for if (numel > 32768)
    for (int64_t o = 0; o < outer; ++o)
      softmax_grad_row(yp + o * len, g + o * len, len, dx + o * len);
    return;
  }
#pragma omp parallel for if (numel > 32768)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * len * inner + i;
      double s = 0;
      for (int64_t k = 0; k < len; ++k)
        s += static_cast<double>(g[base + k * inner]) * yp[base + k * inner];
      const float sf = static_cast<float>(s);
      for (int64_t k = 0; k < len; ++k) {
        const int64_t e = base + k * inner;
        dx[e] = yp[e] * (g[e] - sf);
      }
    }
}

// LogSoftmaxGrad: dX = dY - exp(Y) sum(dY) along the axis, the sum in double. Writes every
// element of dX.
void log_softmax_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kSoftmaxGradArity);
  const auto operands = ops::softmax_grad_operands(a, io, [](Tensor& t) { ops::zero(t); });
  if (!operands) return;
  const int64_t outer = operands->view.outer, len = operands->view.len,
                inner = operands->view.inner, numel = operands->y->numel();
  const float* yp = operands->y->as<float>();
  const float* g = operands->dy->as<float>();
  float* dx = operands->dx->as<float>();
#pragma omp parallel for if (numel > 32768)
  for (int64_t r = 0; r < outer * inner; ++r) {
    const int64_t base = (r / inner) * len * inner + r % inner;
    double s = 0;
    for (int64_t k = 0; k < len; ++k) s += g[base + k * inner];
    const float sf = static_cast<float>(s);
    for (int64_t k = 0; k < len; ++k) {
      const int64_t e = base + k * inner;
      dx[e] = g[e] - std::exp(yp[e]) * sf;
    }
  }
}

std::string check_softmax_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, ops::kSoftmaxGradArity); !why.empty()) return why;
  return all_float32(s);
}

const KernelEntry kKernels[] = {
    {"BatchNormalizationGrad", batch_norm_grad, check_batch_norm_grad,
     /*writes_every_output=*/true},
    {"LayerNormalizationGrad", layer_norm_grad, check_layer_norm_grad,
     /*writes_every_output=*/true},
    {"SoftmaxGrad", softmax_grad, check_softmax_grad, /*writes_every_output=*/true},
    {"LogSoftmaxGrad", log_softmax_grad, check_softmax_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_norm_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
