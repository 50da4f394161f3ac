// Kernels of the matmul family (see families.h): MatMul with numpy semantics and Gemm, both on
// float32 through oneDNN's matmul primitive, and on bfloat16 throughout (mixed precision)
// natively: oneDNN multiplies bfloat16 operands with float32 accumulation (AVX512-BF16 or AMX
// where the CPU has them, else its own emulation) and rounds the result to bfloat16 once.
#include <algorithm>
#include <cstring>
#include <utility>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/matmul_shape.h"

namespace stagecraft::rt::cpu {
namespace {

using dnnl::memory;

// oneDNN's type of a float32 or bfloat16 tensor.
memory::data_type dnnl_type(DType dtype) {
  return dtype == DType::kBFloat16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// A oneDNN memory over `data` (not owned) viewed as a dense row-major tensor of `shape` and
// `dtype` (float32 or bfloat16).
memory typed_memory(const Shape& shape, DType dtype, const std::byte* data, const CpuContext& ctx) {
  return memory(plain_desc(shape, dnnl_type(dtype)), ctx.engine, const_cast<std::byte*>(data));
}

// Y = C broadcast to [M, N] (C [cm, cn] with cm 1 or M, cn 1 or N), elements of type T.
template <class T>
void broadcast_c(T* dst, const T* src, int64_t m, int64_t n, int64_t cm, int64_t cn) {
#pragma omp parallel for if (m * n > (1 << 16))
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      dst[i * n + j] = src[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
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
  const ops::MatMulShape s = ops::matmul_shape("MatMul", x, y);
  if (s.batch.size() + 2 > DNNL_MAX_NDIMS)
    fail(ErrorKind::kUnsupported,
         "MatMul of {} and {}: {} batch dims that broadcast differently exceed oneDNN's {} dims",
         x.describe(), y.describe(), s.batch.size(), DNNL_MAX_NDIMS);
  expect_shape(a, 0, s.out);
  const int64_t m = s.m, k = s.k, n = s.n;

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
  run_matmul(ctx, typed_memory(with_matrix(s.batch_a, m, k), x.dtype, x.data, ctx),
             typed_memory(with_matrix(s.batch_b, k, n), y.dtype, y.data, ctx),
             typed_memory(with_matrix(s.batch, m, n), out.dtype, out.data, ctx), 1.0f, 0.0f);
}

// Gemm: Y = alpha * A' x B' + beta * C, with A' = transA ? A^T : A (likewise B) and C
// unidirectionally broadcast to [M, N]. Transposes are strided views; C is first broadcast into
// Y and then added by oneDNN's sum post-op.
void gemm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const Tensor& y = a.input(1);
  const ops::GemmShape gs = ops::gemm_shape("Gemm", x, y, a.attrs);
  const bool trans_a = gs.trans_a, trans_b = gs.trans_b;
  const int64_t m = gs.m, k = gs.k, n = gs.n;
  const float alpha = a.attrs.f("alpha", 1.0f);
  float beta = a.attrs.f("beta", 1.0f);
  expect_shape(a, 0, {m, n});
  Tensor& out = *a.out[0];
  const bool bf16 = out.dtype == DType::kBFloat16;  // else float32 (the check)

  // Y starts as C broadcast to [M, N] (C may be [], [N], [1], [M, N], [1, N], [M, 1], [1, 1]).
  if (a.has_input(2) && beta != 0.0f) {
    const Tensor& c = a.input(2);
    const std::pair<int64_t, int64_t> c_dims = ops::gemm_c_dims("Gemm", c, m, n);
    if (bf16)
      broadcast_c(out.as<uint16_t>(), c.as<uint16_t>(), m, n, c_dims.first, c_dims.second);
    else
      broadcast_c(out.as<float>(), c.as<float>(), m, n, c_dims.first, c_dims.second);
  } else {
    beta = 0.0f;
  }
  if (out.numel() == 0) return;
  if (k == 0) {  // Y = beta * C; without C (or beta 0) zeros, not 0 * whatever Y held
    for (int64_t i = 0; i < m * n; ++i) {
      if (!bf16) {
        out.as<float>()[i] = beta == 0.0f ? 0.0f : out.as<float>()[i] * beta;
        continue;
      }
      auto* y16 = static_cast<eltwise::BFloat16*>(static_cast<void*>(out.data)) + i;
      *y16 = eltwise::to_bfloat16(beta == 0.0f ? 0.0f : eltwise::to_float(*y16) * beta);
    }
    return;
  }

  const CpuContext& ctx = context(a);
  // A^T stored [K, M] is the [M, K] matrix with strides {1, M}; likewise B^T.
  const memory::data_type type = dnnl_type(out.dtype);
  memory::desc da = trans_a ? memory::desc({m, k}, type, memory::dims{1, m})
                            : plain_desc({m, k}, type);
  memory::desc db = trans_b ? memory::desc({k, n}, type, memory::dims{1, k})
                            : plain_desc({k, n}, type);
  run_matmul(ctx, memory(da, ctx.engine, x.data), memory(db, ctx.engine, y.data),
             typed_memory({m, n}, out.dtype, out.data, ctx), alpha, beta);
}

// MatMul and Gemm: float32, or bfloat16 throughout (operands, Gemm's C, and result).
std::string matmul_check(const OpSignature& s) {
  const auto bf16 = [](DType d) { return d == DType::kBFloat16 || d == DType::kUndefined; };
  if (std::all_of(s.inputs.begin(), s.inputs.end(), bf16) &&
      std::all_of(s.outputs.begin(), s.outputs.end(), bf16) && !s.outputs.empty() &&
      s.outputs[0] == DType::kBFloat16)
    return "";
  return all_float32(s);
}

const KernelEntry kKernels[] = {
    {"MatMul", matmul, matmul_check},
    {"Gemm", gemm, matmul_check},
};

}  // namespace

std::span<const KernelEntry> matmul_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
