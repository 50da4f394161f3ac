// Gradients of MatMul and Gemm (oneDNN matmul on strided views). The contract every gradient
// kernel follows is runtime/format/grad_ops.h: inputs x0..x{n-1}, y0, dy0; outputs dx0..dx{n-1}.
// (SoftmaxCrossEntropyLoss's gradient lives with its forward kernel in loss.cpp.)
//
// MatMul: dA = dY x B^T and dB = A^T x dY per batch, summed over the batch dims along which the
// operand was broadcast. Where one operand has no batch dims at all (a layer's weights), its
// gradient is one 2-D product over the other's rows; otherwise the full-batch product is made
// in a scratch buffer and summed down.
// Gemm: with A' = op(A), B' = op(B): dA' = alpha dY B'^T, dB' = alpha A'^T dY, dC = beta dY summed
// to C's shape; transposes are strided views.
// Both in float32, or in bfloat16 throughout (mixed precision) natively, as the forward
// (matmul.cpp): bfloat16 operands, float32 accumulation, each result rounded to bfloat16 once
// (a sum over broadcast batches is summed in float32 first).
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/matmul_shape.h"

namespace stagecraft::rt::cpu {
namespace {

using dnnl::memory;

// A matrix operand of a product: dims [batch..., rows, cols] over `data`, possibly transposed
// (the stored tensor is [batch..., cols, rows]).
struct Operand {
  memory::dims dims;
  memory::dims strides;
  const void* data;
};

// Dense row-major [batch..., r, c]; with `transposed`, the stored [batch..., c, r] seen as [.., r,
// c].
Operand view(memory::dims batch, int64_t r, int64_t c, const void* data, bool transposed) {
  Operand o;
  o.dims = batch;
  o.dims.push_back(r);
  o.dims.push_back(c);
  o.strides.assign(o.dims.size(), 0);
  const int64_t matrix = r * c;
  int64_t s = matrix;
  for (size_t i = batch.size(); i-- > 0;) {
    o.strides[i] = s;
    s *= batch[i];
  }
  if (transposed) {
    o.strides[batch.size()] = 1;
    o.strides[batch.size() + 1] = r;
  } else {
    o.strides[batch.size()] = c;
    o.strides[batch.size() + 1] = 1;
  }
  o.data = data;
  return o;
}

// [batch..., r, c].
memory::dims with_matrix(memory::dims batch, int64_t r, int64_t c) {
  batch.push_back(r);
  batch.push_back(c);
  return batch;
}

// The element types of a product: its operands' and its destination's (float32 or bfloat16).
struct Types {
  memory::data_type operands = memory::data_type::f32, dst = memory::data_type::f32;
};

// dst = alpha * src x weights. dst is dense row-major.
void product(const CpuContext& ctx, const Operand& src, const Operand& weights,
             memory::dims dst_dims, void* dst, float alpha, Types types) {
  memory::desc sd(src.dims, types.operands, src.strides),
      wd(weights.dims, types.operands, weights.strides);
  memory::desc dd = plain_desc(Shape(dst_dims.begin(), dst_dims.end()), types.dst);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(sd, wd, dd), attr, ctx.engine);
    dnnl::stream stream = ctx.stream;
    dnnl::matmul(pd).execute(
        stream, {{DNNL_ARG_SRC, memory(sd, ctx.engine, const_cast<void*>(src.data))},
                 {DNNL_ARG_WEIGHTS, memory(wd, ctx.engine, const_cast<void*>(weights.data))},
                 {DNNL_ARG_DST, memory(dd, ctx.engine, dst)}});
    stream.wait();
  } catch (const dnnl::error& e) {
    fail(ErrorKind::kUnsupported, "oneDNN cannot run a gradient matmul: {}", e.what());
  }
}

// Sums `full` [batch..., r, c] over the batch dims where `target` [tbatch..., r, c] (same rank,
// dims 1 where broadcast) is 1, into `out` (overwritten).
void sum_batches(const float* full, const memory::dims& batch, const memory::dims& tbatch,
                 int64_t matrix, float* out) {
  int64_t full_count = 1, out_count = 1;
  for (size_t i = 0; i < batch.size(); ++i) {
    full_count *= batch[i];
    out_count *= tbatch[i];
  }
  std::fill_n(out, out_count * matrix, 0.0f);
  // Each full batch index maps to one target batch index.
  std::vector<int64_t> target(static_cast<size_t>(full_count));
  for (int64_t b = 0; b < full_count; ++b) {
    int64_t rest = b, t = 0, tstride = 1;
    for (size_t i = batch.size(); i-- > 0;) {
      const int64_t idx = rest % batch[i];
      rest /= batch[i];
      if (tbatch[i] != 1) t += idx * tstride;
      tstride *= tbatch[i];
    }
    target[b] = t;
  }
#pragma omp parallel for if (out_count * matrix *                                  \
                                 (full_count / std::max <int64_t>(out_count, 1)) > \
                             32768)
  for (int64_t e = 0; e < matrix; ++e)
    for (int64_t b = 0; b < full_count; ++b) out[target[b] * matrix + e] += full[b * matrix + e];
}

// `full` summed as sum_batches into `out`: directly when it is float32, through a float32
// buffer rounded to bfloat16 once when it is bfloat16.
void sum_batches_into(const float* full, const memory::dims& batch, const memory::dims& tbatch,
                      int64_t matrix, Tensor& out) {
  if (out.dtype == DType::kFloat32)
    return sum_batches(full, batch, tbatch, matrix, out.as<float>());
  std::vector<float> sum(static_cast<size_t>(out.numel()));
  sum_batches(full, batch, tbatch, matrix, sum.data());
  auto* dst = static_cast<eltwise::BFloat16*>(static_cast<void*>(out.data));
  for (size_t i = 0; i < sum.size(); ++i) dst[i] = eltwise::to_bfloat16(sum[i]);
}

// The gradient ops' operand counts: n forward inputs, one forward output.
constexpr ops::GradArity kMatMulArity{.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1};
constexpr ops::GradArity kGemmArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 1};

// Writes every element of the outputs it is given: each is one product (oneDNN overwrites its
// destination) or a sum of products into zeros, and zeros where an operand is empty.
void matmul_grad(const KernelArgs& a) {
  const ops::GradIo io(a, kMatMulArity);
  const bool want_a = io.wants(0), want_b = io.wants(1);
  if (!want_a && !want_b) return;
  const Tensor& x = io.need_x(0);
  const Tensor& y = io.need_x(1);
  const ops::MatMulShape s = ops::matmul_shape("MatMulGrad", x, y);
  if (io.dy(0) == nullptr) return ops::zero_outputs(a);  // no output gradient: zeros
  const Tensor& dy = *io.dy(0);
  const int64_t m = s.m, k = s.k, n = s.n;
  const memory::dims &ba = s.batch_a, &bb = s.batch_b, &bf = s.batch;
  if (bf.size() + 2 > DNNL_MAX_NDIMS)
    fail(ErrorKind::kUnsupported, "MatMulGrad of {} and {}: too many batch dims for oneDNN",
         x.describe(), y.describe());
  const int64_t full = s.batch_count();
  if (dy.numel() != full * m * n)
    fail(ErrorKind::kShape, "MatMulGrad: dY {} does not match the product of {} and {}",
         dy.describe(), x.describe(), y.describe());
  if (want_a) expect_shape(a, 0, x.shape);
  if (want_b) expect_shape(a, 1, y.shape);
  if (full * m * n == 0 || k == 0) return ops::zero_outputs(a);  // gradients are all zero
  const CpuContext& ctx = context(a);
  const bool a_full = ba == bf, b_full = bb == bf;
  const bool b_unbatched = std::all_of(bb.begin(), bb.end(), [](int64_t d) { return d == 1; });
  // Straight into the output in its own type; into a float32 buffer to sum over batches.
  const auto type = dy.dtype == DType::kBFloat16 ? memory::data_type::bf16
                                                 : memory::data_type::f32;
  const Types direct{type, type}, summed{type, memory::data_type::f32};

  if (want_a) {
    Tensor& out = *io.dx(0);
    if (a_full) {
      // dA [bf, m, k] = dY [bf, m, n] x B^T [bb, n, k]
      product(ctx, view(bf, m, n, dy.data, false), view(bb, n, k, y.data, true),
              with_matrix(bf, m, k), out.data, 1.0f, direct);
    } else {
      std::vector<float> tmp(static_cast<size_t>(full * m * k));
      product(ctx, view(bf, m, n, dy.data, false), view(bb, n, k, y.data, true),
              with_matrix(bf, m, k), tmp.data(), 1.0f, summed);
      sum_batches_into(tmp.data(), bf, ba, m * k, out);
    }
  }
  if (want_b) {
    Tensor& out = *io.dx(1);
    if (b_unbatched && a_full) {
      // No batch dims on B: dB [k, n] = A^T [k, P*m] x dY [P*m, n] over all rows at once.
      product(ctx, view({}, k, full * m, x.data, true), view({}, full * m, n, dy.data, false),
              {k, n}, out.data, 1.0f, direct);
    } else if (b_full) {
      product(ctx, view(ba, k, m, x.data, true), view(bf, m, n, dy.data, false),
              with_matrix(bf, k, n), out.data, 1.0f, direct);
    } else {
      std::vector<float> tmp(static_cast<size_t>(full * k * n));
      product(ctx, view(ba, k, m, x.data, true), view(bf, m, n, dy.data, false),
              with_matrix(bf, k, n), tmp.data(), 1.0f, summed);
      sum_batches_into(tmp.data(), bf, bb, k * n, out);
    }
  }
}

// Writes every element of the outputs it is given, as MatMulGrad; dC is a sum per element.
void gemm_grad(const KernelArgs& a) {
  const ops::GradIo io(a, kGemmArity);
  const Tensor& x = io.need_x(0);
  const Tensor& y = io.need_x(1);
  const ops::GemmShape gs = ops::gemm_shape("GemmGrad", x, y, a.attrs);
  const bool trans_a = gs.trans_a, trans_b = gs.trans_b;
  const int64_t m = gs.m, k = gs.k, n = gs.n;
  const float alpha = a.attrs.f("alpha", 1.0f), beta = a.attrs.f("beta", 1.0f);
  if (io.dy(0) == nullptr) return ops::zero_outputs(a);
  const Tensor& dy = *io.dy(0);
  if (dy.shape != Shape{m, n})
    fail(ErrorKind::kShape, "GemmGrad: dY {} should be [{}, {}]", dy.describe(), m, n);
  const CpuContext& ctx = context(a);
  const bool work = m * n > 0 && k > 0;  // else dA and dB are zeros
  const bool bf16 = dy.dtype == DType::kBFloat16;
  const auto type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const Types types{type, type};
  if (io.wants(0)) {
    expect_shape(a, 0, x.shape);
    if (!work)
      ops::zero(*io.dx(0));
    else if (!trans_a)  // dA [m, k] = alpha dY [m, n] x B'^T [n, k]
      product(ctx, view({}, m, n, dy.data, false), view({}, n, k, y.data, !trans_b), {m, k},
              io.dx(0)->data, alpha, types);
    else  // dA [k, m] = alpha B' [k, n] x dY^T [n, m]
      product(ctx, view({}, k, n, y.data, trans_b), view({}, n, m, dy.data, true), {k, m},
              io.dx(0)->data, alpha, types);
  }
  if (io.wants(1)) {
    expect_shape(a, 1, y.shape);
    if (!work)
      ops::zero(*io.dx(1));
    else if (!trans_b)  // dB [k, n] = alpha A'^T [k, m] x dY [m, n]
      product(ctx, view({}, k, m, x.data, !trans_a), view({}, m, n, dy.data, false), {k, n},
              io.dx(1)->data, alpha, types);
    else  // dB [n, k] = alpha dY^T [n, m] x A' [m, k]
      product(ctx, view({}, n, m, dy.data, true), view({}, m, k, x.data, trans_a), {n, k},
              io.dx(1)->data, alpha, types);
  }
  if (io.wants(2)) {
    const Tensor& c = io.need_x(2);
    expect_shape(a, 2, c.shape);
    const auto [cm, cn] = ops::gemm_c_dims("GemmGrad", c, m, n);
    if (beta == 0.0f) return ops::zero(*io.dx(2));
    // dY read and dC written in their own type (float32, or bfloat16 through float32).
    std::vector<float> g_wide, dc_wide;
    const float* g = dy.as<float>();
    float* dc = io.dx(2)->as<float>();
    if (bf16) {
      const auto* g16 = static_cast<const eltwise::BFloat16*>(static_cast<const void*>(dy.data));
      for (int64_t i = 0; i < m * n; ++i) g_wide.push_back(eltwise::to_float(g16[i]));
      dc_wide.resize(static_cast<size_t>(io.dx(2)->numel()));
      g = g_wide.data();
      dc = dc_wide.data();
    }
    if (cm == m && cn == n) {
      for (int64_t i = 0; i < m * n; ++i) dc[i] = beta * g[i];
    } else if (cm == 1 && cn == n) {
      std::vector<double> acc(static_cast<size_t>(n), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) acc[j] += g[i * n + j];
      for (int64_t j = 0; j < n; ++j) dc[j] = static_cast<float>(beta * acc[j]);
    } else if (cn == 1 && cm == m) {
      for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t j = 0; j < n; ++j) s += g[i * n + j];
        dc[i] = static_cast<float>(beta * s);
      }
    } else {
      double s = 0;
      for (int64_t i = 0; i < m * n; ++i) s += g[i];
      dc[0] = static_cast<float>(beta * s);
    }
    auto* dc16 = static_cast<eltwise::BFloat16*>(static_cast<void*>(io.dx(2)->data));
    for (size_t i = 0; i < dc_wide.size(); ++i) dc16[i] = eltwise::to_bfloat16(dc_wide[i]);
  }
}

// Every operand float32, or every one given bfloat16.
std::string float32_or_bf16(const OpSignature& s) {
  const auto bf16 = [](DType d) { return d == DType::kBFloat16 || d == DType::kUndefined; };
  const bool some = std::any_of(s.inputs.begin(), s.inputs.end(),
                                [](DType d) { return d == DType::kBFloat16; });
  if (some && std::all_of(s.inputs.begin(), s.inputs.end(), bf16) &&
      std::all_of(s.outputs.begin(), s.outputs.end(), bf16))
    return "";
  return all_float32(s);
}

std::string check_matmul_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, kMatMulArity); !why.empty()) return why;
  return float32_or_bf16(s);
}

std::string check_gemm_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, kGemmArity); !why.empty()) return why;
  return float32_or_bf16(s);
}

const KernelEntry kKernels[] = {
    {"MatMulGrad", matmul_grad, check_matmul_grad, /*writes_every_output=*/true},
    {"GemmGrad", gemm_grad, check_gemm_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_matmul_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
