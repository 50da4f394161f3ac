// The CUDA backend's matmul family (families.h): MatMul with numpy semantics and Gemm, float32
// (MatMul bfloat16 and float16 too: mixed precision; bfloat16 first run on a GPU on 2026-11-26),
// on cuBLAS (matmul_product.h), as the CPU backend's runtime/cpu/matmul.cpp computes them. The
// operand shapes are read by the shared rules (runtime/ops/matmul_shape.h), so both backends
// accept and refuse the same nodes.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/matmul_product.h"
#include "runtime/format/error.h"
#include "runtime/ops/matmul_shape.h"

namespace stagecraft::rt::cuda {
namespace {

// MatMul: numpy's matmul. A 1-D A is a row [1, K] and a 1-D B a column [K, 1] (their unit dim is
// dropped from the output); batch dims broadcast (a broadcast operand has batch stride 0).
void matmul(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const Tensor& y = a.input(1);
  const ops::MatMulShape s = ops::matmul_shape("MatMul", x, y);
  expect_shape(a, 0, s.out);
  Tensor& out = *a.out[0];
  if (out.numel() == 0) return;
  if (s.k == 0) return context(a).fill_zero(out);
  // float32, or bfloat16 throughout (mixed precision: cuBLAS with float32 accumulation).
  batched_product(a, {s.batch, s.m, s.k, s.n, x.dtype}, {x.data, s.batch_a, false},
                  {y.data, s.batch_b, false}, out.data, 1.0f, 0.0f);
}

// Gemm: Y = alpha * A' x B' + beta * C, with A' = transA ? A^T : A (likewise B) and C
// unidirectionally broadcast to [M, N]: C is first broadcast into Y (a strided gather, stride 0
// along its unit dims), then the product is added to beta * Y by cuBLAS.
void gemm(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const Tensor& y = a.input(1);
  const ops::GemmShape g = ops::gemm_shape("Gemm", x, y, a.attrs);
  const float alpha = a.attrs.f("alpha", 1.0f);
  float beta = a.attrs.f("beta", 1.0f);
  expect_shape(a, 0, {g.m, g.n});
  Tensor& out = *a.out[0];
  CudaContext& ctx = context(a);
  if (a.has_input(2) && beta != 0.0f) {
    const Tensor& c = a.input(2);
    const std::pair<int64_t, int64_t> c_dims = ops::gemm_c_dims("Gemm", c, g.m, g.n);
    if (out.numel() > 0) {
      const IndexMap map = index_map(
          a, {g.m, g.n}, {c_dims.first == 1 ? 0 : c_dims.second, c_dims.second == 1 ? 0 : 1});
      launch_strided_gather(out.data, c.data, sizeof(float), out.numel(), map, ctx.stream());
      check_launch(a);
    }
  } else {
    beta = 0.0f;
  }
  if (out.numel() == 0) return;
  if (g.k == 0) {  // the product is zeros: Y = beta * C
    if (beta == 0.0f) return ctx.fill_zero(out);
    return scale(a, out.as<float>(), out.numel(), beta);
  }
  batched_product(a, {{}, g.m, g.k, g.n}, {x.as<float>(), {}, g.trans_a},
                  {y.as<float>(), {}, g.trans_b}, out.as<float>(), alpha, beta);
}

// MatMul's check: float16 throughout natively here (cuBLAS half GEMM, float32 accumulation;
// --precision fp16; tests/gpu/gpu_pipeline_test.cpp), where the CPU widens it to float32; else
// the CPU's.
std::string matmul_check(const OpSignature& s) {
  auto half = [](DType d) { return d == DType::kFloat16; };
  const bool all_half = std::all_of(s.inputs.begin(), s.inputs.end(), half) &&
                        std::all_of(s.outputs.begin(), s.outputs.end(), half);
  if (s.inputs.size() == 2 && s.outputs.size() == 1 && all_half) return "";
  return same_as_cpu(s);
}

// The checks are the CPU's: every input and output float32; MatMul also bfloat16 throughout
// (the CPU's oneDNN and this cuBLAS path both multiply it natively), and float16 (above).
const KernelEntry kKernels[] = {
    {"MatMul", matmul, matmul_check},
    {"Gemm", gemm, same_as_cpu_float32},
};

}  // namespace

std::span<const KernelEntry> matmul_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
