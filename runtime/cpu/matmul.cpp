// Kernels of the matmul family (see families.h): MatMul with numpy semantics and Gemm, both on
// float32 through oneDNN's matmul primitive.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cpu {
namespace {

using dnnl::memory;

// A oneDNN memory over `data` (not owned) viewed as a dense row-major float32 tensor of `shape`.
memory f32_memory(const Shape& shape, const std::byte* data, const CpuContext& ctx) {
  return memory(plain_desc(shape), ctx.engine, const_cast<std::byte*>(data));
}

// Runs a oneDNN matmul dst = alpha * src x weights + beta * dst (beta 0: dst is overwritten).
void run_matmul(const CpuContext& ctx, const memory& src, const memory& weights, const memory& dst,
                float alpha, float beta) {
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::desc desc(src.get_desc(), weights.get_desc(), dst.get_desc());
  dnnl::matmul::primitive_desc pd(desc, attr, ctx.engine);
  dnnl::stream stream = ctx.stream;
  dnnl::matmul(pd).execute(stream,
                           {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
  stream.wait();
}

// MatMul: numpy's matmul. A 1-D A is a row [1, K] and a 1-D B a column [K, 1] (their unit dim
// is dropped from the output); batch dims broadcast. Batch dims that are 1 everywhere are
// dropped and neighbours that broadcast alike are merged, so oneDNN sees the fewest dims.
void matmul(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const Tensor& y = a.input(1);
  if (x.rank() == 0 || y.rank() == 0)
    fail(ErrorKind::kShape, "MatMul of {} and {}: operands must have rank 1 or more", x.describe(),
         y.describe());
  Shape sa = x.rank() == 1 ? Shape{1, x.shape[0]} : x.shape;
  Shape sb = y.rank() == 1 ? Shape{y.shape[0], 1} : y.shape;
  size_t rank = std::max(sa.size(), sb.size());
  sa.insert(sa.begin(), rank - sa.size(), 1);
  sb.insert(sb.begin(), rank - sb.size(), 1);
  const int64_t m = sa[rank - 2], k = sa[rank - 1], n = sb[rank - 1];
  if (sb[rank - 2] != k)
    fail(ErrorKind::kShape, "MatMul of {} and {}: inner dims {} and {} differ", x.describe(),
         y.describe(), k, sb[rank - 2]);

  // Broadcast batch dims; the recorded output shape drops the dims of promoted 1-D operands.
  Shape batch_a, batch_b, batch;
  Shape expected;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (sa[i] != sb[i] && sa[i] != 1 && sb[i] != 1)
      fail(ErrorKind::kShape, "MatMul of {} and {}: batch dims {} and {} do not broadcast",
           x.describe(), y.describe(), sa[i], sb[i]);
    int64_t d = sa[i] == 1 ? sb[i] : sa[i];
    expected.push_back(d);
    if (d == 1) continue;
    bool same_pattern = !batch.empty() && (batch_a.back() == 1) == (sa[i] == 1) &&
                        (batch_b.back() == 1) == (sb[i] == 1);
    if (same_pattern) {
      batch_a.back() *= sa[i];
      batch_b.back() *= sb[i];
      batch.back() *= d;
    } else {
      batch_a.push_back(sa[i]);
      batch_b.push_back(sb[i]);
      batch.push_back(d);
    }
  }
  if (batch.size() + 2 > DNNL_MAX_NDIMS)
    fail(ErrorKind::kUnsupported,
         "MatMul of {} and {}: {} batch dims that broadcast differently exceed oneDNN's {} dims",
         x.describe(), y.describe(), batch.size(), DNNL_MAX_NDIMS);
  if (x.rank() > 1) expected.push_back(m);
  if (y.rank() > 1) expected.push_back(n);
  expect_shape(a, 0, expected);

  Tensor& out = *a.out[0];
  if (out.numel() == 0) return;
  if (k == 0) {
    std::memset(out.data, 0, static_cast<size_t>(out.bytes()));
    return;
  }
  auto with_matrix = [](Shape dims, int64_t rows, int64_t cols) {
    dims.push_back(rows);
    dims.push_back(cols);
    return dims;
  };
  const CpuContext& ctx = context(a);
  run_matmul(ctx, f32_memory(with_matrix(batch_a, m, k), x.data, ctx),
             f32_memory(with_matrix(batch_b, k, n), y.data, ctx),
             f32_memory(with_matrix(batch, m, n), out.data, ctx), 1.0f, 0.0f);
}

// Gemm: Y = alpha * A' x B' + beta * C, with A' = transA ? A^T : A (likewise B) and C
// unidirectionally broadcast to [M, N]. Transposes are strided views; C is first broadcast into
// Y and then added by oneDNN's sum post-op.
void gemm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const Tensor& y = a.input(1);
  if (x.rank() != 2 || y.rank() != 2)
    fail(ErrorKind::kShape, "Gemm of {} and {}: A and B must be matrices", x.describe(),
         y.describe());
  const bool trans_a = a.attrs.i("transA", 0) != 0, trans_b = a.attrs.i("transB", 0) != 0;
  const float alpha = a.attrs.f("alpha", 1.0f);
  float beta = a.attrs.f("beta", 1.0f);
  const int64_t m = trans_a ? x.shape[1] : x.shape[0], k = trans_a ? x.shape[0] : x.shape[1];
  const int64_t n = trans_b ? y.shape[0] : y.shape[1], kb = trans_b ? y.shape[1] : y.shape[0];
  if (k != kb)
    fail(ErrorKind::kShape, "Gemm of {} and {} (transA={}, transB={}): inner dims {} and {} differ",
         x.describe(), y.describe(), int(trans_a), int(trans_b), k, kb);
  expect_shape(a, 0, {m, n});
  Tensor& out = *a.out[0];
  float* dst = out.as<float>();

  // Y starts as C broadcast to [M, N] (C may be [], [N], [1], [M, N], [1, N], [M, 1], [1, 1]).
  if (a.has_input(2) && beta != 0.0f) {
    const Tensor& c = a.input(2);
    const Shape& sc = c.shape;
    int64_t cm = sc.size() == 2 ? sc[0] : 1, cn = sc.empty() ? 1 : sc.back();
    if (sc.size() > 2 || (cm != 1 && cm != m) || (cn != 1 && cn != n))
      fail(ErrorKind::kShape, "Gemm: C {} does not broadcast to [{}, {}]", c.describe(), m, n);
    const float* src = c.as<float>();
#pragma omp parallel for if (m * n > (1 << 16))
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        dst[i * n + j] = src[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
  } else {
    beta = 0.0f;
  }
  if (out.numel() == 0) return;
  if (k == 0) {  // Y = beta * C; without C (or beta 0) zeros, not 0 * whatever Y held
    for (int64_t i = 0; i < m * n; ++i) dst[i] = beta == 0.0f ? 0.0f : dst[i] * beta;
    return;
  }

  const CpuContext& ctx = context(a);
  // A^T stored [K, M] is the [M, K] matrix with strides {1, M}; likewise B^T.
  memory::desc da = trans_a ? memory::desc({m, k}, memory::data_type::f32, memory::dims{1, m})
                            : plain_desc({m, k});
  memory::desc db = trans_b ? memory::desc({k, n}, memory::data_type::f32, memory::dims{1, k})
                            : plain_desc({k, n});
  run_matmul(ctx, memory(da, ctx.engine, x.data), memory(db, ctx.engine, y.data),
             f32_memory({m, n}, out.data, ctx), alpha, beta);
}

const KernelEntry kKernels[] = {
    {"MatMul", matmul, all_float32},
    {"Gemm", gemm, all_float32},
};

}  // namespace

std::span<const KernelEntry> matmul_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
