// The CUDA backend's gradients of MatMul and Gemm (families.h), float32 on cuBLAS
// (matmul_product.h), MatMul's also bfloat16 and float16 throughout (mixed precision: 16-bit
// products with float32 accumulation, as the forward MatMul), with the contract of
// runtime/format/grad_ops.h and the formulas of the CPU backend's runtime/cpu/grad_matmul.cpp;
// operand shapes are read by the shared rules (runtime/ops/matmul_shape.h). Only the named
// outputs are computed (a weight-gradient node of a zero-bubble schedule names dB alone).
//
// MatMul: dA = dY x B^T and dB = A^T x dY per batch, summed over the batch dims along which the
// operand was broadcast. Where B has no batch dims (a layer's weights) and A has all of them,
// dB is one product over all of A's rows; otherwise the full-batch product goes to a scratch
// tensor that a fixed-order reduction (in double, no atomics) sums down to the operand's shape.
// Gemm: with A' = op(A), B' = op(B): dA' = alpha dY B'^T, dB' = alpha A'^T dY, dC = beta dY
// summed to C's shape; transposes are read as stored (cuBLAS's OP_T).
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/elementwise_kernels.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/matmul_product.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/matmul_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradArity;
using ops::GradIo;

// The gradient ops' operand counts: n forward inputs, one forward output.
constexpr GradArity kMatMulArity{.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1};
constexpr GradArity kGemmArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 1};

// [batch..., rows, cols].
Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

// out [own..., rows, cols] = L x R over the full batch `dims.batch`, summed over the batch dims
// where `own` is 1 (through a float32 scratch tensor) when there are any. With 16-bit operands
// the scratch keeps cuBLAS's float32 accumulation and the sum is rounded to 16 bits once.
void product_summed(const KernelArgs& a, ProductDims dims, const MatrixOperand& l,
                    const MatrixOperand& r, const Shape& own, Tensor& out) {
  if (own == dims.batch) return batched_product(a, dims, l, r, out.data, 1.0f, 0.0f);
  CudaContext& ctx = context(a);
  const Shape full = with_matrix(dims.batch, dims.rows, dims.cols);
  const Shape summed = with_matrix(own, dims.rows, dims.cols);
  Tensor scratch = ctx.new_tensor(DType::kFloat32, full, false);
  dims.out_dtype = DType::kFloat32;
  batched_product(a, dims, l, r, scratch.data, 1.0f, 0.0f);
  if (out.dtype == DType::kFloat32)
    return sum_to_shape(a, scratch.as<float>(), full, out.as<float>(), summed);
  Tensor wide = ctx.new_tensor(DType::kFloat32, summed, false);
  sum_to_shape(a, scratch.as<float>(), full, wide.as<float>(), summed);
  if (!launch_cast(DType::kFloat32, out.dtype, wide.data, out.data, out.numel(), ctx.stream()))
    refuse_dtype(a, out.dtype);
  check_launch(a);
}

// Writes every element of the outputs it is given: each is one product (cuBLAS with beta 0
// overwrites its destination) or a reduction that overwrites it, or zeros where an operand is
// empty or dY is omitted.
void matmul_grad(const KernelArgs& a) {
  const GradIo io(a, kMatMulArity);
  const bool want_a = io.wants(0), want_b = io.wants(1);
  if (!want_a && !want_b) return;
  const Tensor& x = io.need_x(0);
  const Tensor& y = io.need_x(1);
  const ops::MatMulShape s = ops::matmul_shape("MatMulGrad", x, y);
  if (io.dy(0) == nullptr) return zero_outputs(a);  // no output gradient: zeros
  const Tensor& dy = *io.dy(0);
  const int64_t m = s.m, k = s.k, n = s.n, full = s.batch_count();
  if (dy.numel() != full * m * n)
    fail(ErrorKind::kShape, "MatMulGrad: dY {} does not match the product of {} and {}",
         dy.describe(), x.describe(), y.describe());
  if (want_a) expect_shape(a, 0, x.shape);
  if (want_b) expect_shape(a, 1, y.shape);
  if (full * m * n == 0 || k == 0) return zero_outputs(a);  // gradients are all zero
  // float32, or one 16-bit type throughout (the check).
  const DType t = x.dtype;
  const void* xs = x.data;
  const void* ys = y.data;
  const void* dys = dy.data;

  if (want_a)  // dA [bf, m, k] = dY [bf, m, n] x B^T [bb, n, k] (B is stored [bb, k, n])
    product_summed(a, {s.batch, m, n, k, t}, {dys, s.batch, false}, {ys, s.batch_b, true},
                   s.batch_a, *io.dx(0));
  if (want_b) {
    const bool b_unbatched =
        std::all_of(s.batch_b.begin(), s.batch_b.end(), [](int64_t d) { return d == 1; });
    if (b_unbatched && s.batch_a == s.batch)
      // dB [k, n] = A^T [k, P*m] x dY [P*m, n] over all rows at once (A stored [P*m, k]).
      batched_product(a, {{}, k, full * m, n, t}, {xs, {}, true}, {dys, {}, false},
                      io.dx(1)->data, 1.0f, 0.0f);
    else  // dB [bf, k, n] = A^T [ba, k, m] x dY [bf, m, n] (A stored [ba, m, k])
      product_summed(a, {s.batch, k, m, n, t}, {xs, s.batch_a, true}, {dys, s.batch, false},
                     s.batch_b, *io.dx(1));
  }
}

// dC [C's shape] = beta * dY [m, n] summed over the dims along which C was broadcast.
void gemm_c_grad(const KernelArgs& a, const GradIo& io, const Tensor& dy, int64_t m, int64_t n) {
  const Tensor& c = io.need_x(2);
  expect_shape(a, 2, c.shape);
  ops::gemm_c_dims("GemmGrad", c, m, n);
  Tensor& dc = *io.dx(2);
  const float beta = a.attrs.f("beta", 1.0f);
  if (beta == 0.0f) return context(a).fill_zero(dc);
  sum_to_shape(a, dy.as<float>(), {m, n}, dc.as<float>(), c.shape);
  scale(a, dc.as<float>(), dc.numel(), beta);
}

// Writes every element of the outputs it is given, as MatMulGrad.
void gemm_grad(const KernelArgs& a) {
  const GradIo io(a, kGemmArity);
  const Tensor& x = io.need_x(0);
  const Tensor& y = io.need_x(1);
  const ops::GemmShape g = ops::gemm_shape("GemmGrad", x, y, a.attrs);
  const int64_t m = g.m, k = g.k, n = g.n;
  const float alpha = a.attrs.f("alpha", 1.0f);
  if (io.dy(0) == nullptr) return zero_outputs(a);
  const Tensor& dy = *io.dy(0);
  if (dy.shape != Shape{m, n})
    fail(ErrorKind::kShape, "GemmGrad: dY {} should be [{}, {}]", dy.describe(), m, n);
  CudaContext& ctx = context(a);
  const bool work = m * n > 0 && k > 0;  // else dA and dB are zeros
  const float* xs = x.as<float>();
  const float* ys = y.as<float>();
  const float* dys = dy.as<float>();
  if (io.wants(0)) {
    expect_shape(a, 0, x.shape);
    float* da = io.dx(0)->as<float>();
    if (!work)
      ctx.fill_zero(*io.dx(0));
    else if (!g.trans_a)  // dA [m, k] = alpha dY [m, n] x B'^T [n, k]; B'^T is B^T unless transB
      batched_product(a, {{}, m, n, k}, {dys, {}, false}, {ys, {}, !g.trans_b}, da, alpha, 0.0f);
    else  // dA [k, m] = alpha B' [k, n] x dY^T [n, m]
      batched_product(a, {{}, k, n, m}, {ys, {}, g.trans_b}, {dys, {}, true}, da, alpha, 0.0f);
  }
  if (io.wants(1)) {
    expect_shape(a, 1, y.shape);
    float* db = io.dx(1)->as<float>();
    if (!work)
      ctx.fill_zero(*io.dx(1));
    else if (!g.trans_b)  // dB [k, n] = alpha A'^T [k, m] x dY [m, n]; A'^T is A^T unless transA
      batched_product(a, {{}, k, m, n}, {xs, {}, !g.trans_a}, {dys, {}, false}, db, alpha, 0.0f);
    else  // dB [n, k] = alpha dY^T [n, m] x A' [m, k]
      batched_product(a, {{}, n, m, k}, {dys, {}, true}, {xs, {}, g.trans_a}, db, alpha, 0.0f);
  }
  if (io.wants(2)) gemm_c_grad(a, io, dy, m, n);
}

// MatMulGrad's check: the CPU's, with every operand float32, or one 16-bit type (bfloat16 or
// float16) throughout: then natively here (cuBLAS, float32 accumulation), as the forward MatMul.
// The CPU runs bfloat16 natively too and widens float16 to float32.
std::string matmul_grad_check(const OpSignature& s) {
  DType half = DType::kUndefined;
  bool uniform = true;
  auto see = [&](DType d) {
    if (d == DType::kUndefined) return;  // an output not asked for
    if (!is_16bit_float(d)) uniform = false;
    if (half == DType::kUndefined) half = d;
    if (d != half) uniform = false;
  };
  for (DType d : s.inputs) see(d);
  for (DType d : s.outputs) see(d);
  if (!uniform || half == DType::kUndefined) return same_as_cpu_float32(s);
  auto wide = [](std::span<const DType> types) {
    std::vector<DType> out(types.begin(), types.end());
    for (DType& d : out)
      if (d != DType::kUndefined) d = DType::kFloat32;
    return out;
  };
  const std::vector<DType> in = wide(s.inputs), out = wide(s.outputs);
  return same_as_cpu(OpSignature{s.op_type, in, out, s.attrs});
}

// The checks are the CPU's: the gradient-op arity and every operand float32; MatMulGrad also
// 16-bit throughout (above).
const KernelEntry kKernels[] = {
    {"MatMulGrad", matmul_grad, matmul_grad_check, /*writes_every_output=*/true},
    {"GemmGrad", gemm_grad, same_as_cpu_float32, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_matmul_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
