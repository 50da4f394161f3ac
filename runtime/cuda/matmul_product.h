#pragma once
/// \file
/// Batched float32 (and bfloat16) matrix products on cuBLAS for the CUDA matmul family and its gradients
/// (matmul.cpp, grad_matmul.cpp). Operands are row-major, each possibly stored transposed and
/// repeated (broadcast) along some batch dims; the batch dims are those of `ops::MatMulShape`
/// (unit dims dropped, dims along which both operands broadcast alike merged), so one
/// cublasSgemmStridedBatched call covers one batch dim and the calls loop over the others.

#include <cstdint>

#include "runtime/core/kernel.h"
#include "runtime/cuda/cuda_context.h"

namespace stagecraft::rt::cuda {

/// One operand of a product, per batch a [rows, cols] row-major matrix.
struct MatrixOperand {
  const void* data = nullptr;  ///< Elements of the product's dtype (ProductDims::dtype).
  /// The operand's batch dims, as many as the product's: each the product's dim, or 1 where
  /// the operand is broadcast along it. Its matrices are dense and consecutive in that order.
  Shape batch;
  /// Stored transposed: each [rows, cols] matrix is the dense [cols, rows] one read as its
  /// transpose.
  bool transposed = false;
};

/// The product D [batch..., rows, cols] = L [rows, inner] x R [inner, cols] per batch.
struct ProductDims {
  Shape batch;  ///< The product's batch dims (each above 1; empty for one matrix).
  int64_t rows = 0, inner = 0, cols = 0;
  /// The dtype of both operands and of D: float32 (cublasSgemm, no TF32: results held to the
  /// CPU's at rtol 1e-4), or bfloat16 or float16 (mixed precision: cublasGemmEx with
  /// CUDA_R_16BF or CUDA_R_16F operands and CUBLAS_COMPUTE_32F, float32 accumulation, D
  /// rounded to 16 bits once).
  DType dtype = DType::kFloat32;
  /// D's dtype where it differs from the operands': float32 for 16-bit operands (the product
  /// kept at its float32 accumulation, for a sum over batches before one rounding). kUndefined:
  /// `dtype`.
  DType out_dtype = DType::kUndefined;
};

/// D = alpha * L x R + beta * D on the context's stream, D dense [batch..., rows, cols] (with
/// beta 0, D is overwritten and never read). Every dim is above 0 (the caller handles empty
/// products). Throws `Error(kInternal)` naming the node `a` when cuBLAS refuses a call.
void batched_product(const KernelArgs& a, const ProductDims& dims, const MatrixOperand& l,
                     const MatrixOperand& r, void* d, float alpha, float beta);

/// x *= alpha for the `n` floats at `x` on the context's stream (cuBLAS).
void scale(const KernelArgs& a, float* x, int64_t n, float alpha);

}  // namespace stagecraft::rt::cuda
