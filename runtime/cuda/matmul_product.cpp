// Batched products on cuBLAS (matmul_product.h). cuBLAS is column-major: a row-major [r, c]
// matrix with leading dimension c is, read column-major, its own transpose [c, r]. So the
// row-major D = L x R is computed as the column-major D^T = R^T x L^T, with R as cuBLAS's first
// operand and L as its second; an operand stored transposed is handed over as stored with
// CUBLAS_OP_T.
#include "runtime/cuda/matmul_product.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cuda {
namespace {

// Elements between consecutive matrices of an operand along each batch dim of the product
// (`batch`): dense over the operand's own dims (`own`), 0 where it is broadcast.
std::vector<int64_t> batch_strides(const Shape& batch, const Shape& own, int64_t matrix) {
  std::vector<int64_t> strides(batch.size(), 0);
  int64_t running = matrix;
  for (size_t g = batch.size(); g-- > 0;) {
    if (own[g] == batch[g] && own[g] != 1) strides[g] = running;
    running *= own[g];
  }
  return strides;
}

bool unbatched(const Shape& own) {
  return std::all_of(own.begin(), own.end(), [](int64_t d) { return d == 1; });
}

cublasOperation_t op_of(const MatrixOperand& o) { return o.transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void batched_product(const KernelArgs& a, const ProductDims& dims, const MatrixOperand& l,
                     const MatrixOperand& r, void* d, float alpha, float beta) {
  if (dims.dtype != DType::kFloat32 && dims.dtype != DType::kBFloat16 &&
      dims.dtype != DType::kFloat16)
    fail(ErrorKind::kInternal, "{} '{}': a product of {} (float32, bfloat16 and float16 only)",
         a.op_type, a.name, dtype_name(dims.dtype));
  // The 16-bit types through cublasGemmStridedBatchedEx with float32 accumulation.
  const bool bf16 = dims.dtype != DType::kFloat32;
  const cudaDataType_t half = dims.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  const DType d_dtype = dims.out_dtype == DType::kUndefined ? dims.dtype : dims.out_dtype;
  if (d_dtype != dims.dtype && !(bf16 && d_dtype == DType::kFloat32))
    fail(ErrorKind::kInternal, "{} '{}': a product of {} into {} (16-bit into float32 only)",
         a.op_type, a.name, dtype_name(dims.dtype), dtype_name(d_dtype));
  const cudaDataType_t d_type = d_dtype == DType::kFloat32 ? CUDA_R_32F : half;
  const int64_t element = dtype_size(dims.dtype), d_element = dtype_size(d_dtype);
  // The i-th element of an operand, as cuBLAS takes its pointers.
  auto at = [element](const void* p, int64_t i) {
    return static_cast<const void*>(static_cast<const std::byte*>(p) + i * element);
  };
  if (l.batch.size() != dims.batch.size() || r.batch.size() != dims.batch.size())
    fail(ErrorKind::kInternal, "{} '{}': operands with {} and {} batch dims for a product with {}",
         a.op_type, a.name, l.batch.size(), r.batch.size(), dims.batch.size());
  Shape batch = dims.batch, l_batch = l.batch, r_batch = r.batch;
  int64_t rows = dims.rows;
  const int64_t inner = dims.inner, cols = dims.cols;
  // R the same for every batch and L a dense stack of untransposed matrices: the stack is one
  // [batch * rows, inner] matrix, so the batch becomes rows of one product.
  if (!batch.empty() && unbatched(r_batch) && !l.transposed && l_batch == batch) {
    for (int64_t b : batch) rows *= b;
    batch.clear();
    l_batch.clear();
    r_batch.clear();
  }
  // Leading dims of the stored (row-major) matrices: their row lengths.
  const int64_t ld_l = l.transposed ? rows : inner;  // stored [inner, rows] or [rows, inner]
  const int64_t ld_r = r.transposed ? inner : cols;  // stored [cols, inner] or [inner, cols]
  const std::vector<int64_t> stride_l = batch_strides(batch, l_batch, rows * inner);
  const std::vector<int64_t> stride_r = batch_strides(batch, r_batch, inner * cols);
  const std::vector<int64_t> stride_d = batch_strides(batch, batch, rows * cols);

  // The largest batch dim is cuBLAS's batch (one strided call); the others are looped over.
  size_t strided = 0;
  for (size_t g = 1; g < batch.size(); ++g)
    if (batch[g] > batch[strided]) strided = g;
  const int64_t count = batch.empty() ? 1 : batch[strided];
  int64_t loops = 1;
  for (size_t g = 0; g < batch.size(); ++g)
    if (g != strided) loops *= batch[g];

  cublasHandle_t handle = context(a).cublas();
  for (int64_t loop = 0; loop < loops; ++loop) {
    int64_t rest = loop, off_l = 0, off_r = 0, off_d = 0;
    for (size_t g = batch.size(); g-- > 0;) {
      if (g == strided) continue;
      const int64_t index = rest % batch[g];
      rest /= batch[g];
      off_l += index * stride_l[g];
      off_r += index * stride_r[g];
      off_d += index * stride_d[g];
    }
    const long long sl = batch.empty() ? 0 : stride_l[strided];
    const long long sr = batch.empty() ? 0 : stride_r[strided];
    const long long sd = batch.empty() ? rows * cols : stride_d[strided];
    // Row-major D [rows, cols] = L [rows, inner] x R [inner, cols] is column-major
    // D^T [cols, rows] = R^T [cols, inner] x L^T [inner, rows]: cuBLAS's m = cols, n = rows,
    // k = inner; its A is R (read as stored: R^T with OP_N when R is [inner, cols] with ld cols,
    // or OP_T when R is stored [cols, inner] with ld inner), its B is L (L^T with OP_N from
    // [rows, inner], ld inner; OP_T from the stored [inner, rows], ld rows), and its C is D,
    // ld cols. Broadcast operands have batch stride 0.
    void* d_at = static_cast<std::byte*>(d) + off_d * d_element;
    const cublasStatus_t status =
        bf16 ? cublasGemmStridedBatchedEx_64(
                   handle, op_of(r), op_of(l), cols, rows, inner, &alpha, at(r.data, off_r), half,
                   ld_r, sr, at(l.data, off_l), half, ld_l, sl, &beta, d_at, d_type, cols, sd,
                   count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
             : cublasSgemmStridedBatched_64(
                   handle, op_of(r), op_of(l), cols, rows, inner, &alpha,
                   static_cast<const float*>(at(r.data, off_r)), ld_r, sr,
                   static_cast<const float*>(at(l.data, off_l)), ld_l, sl, &beta,
                   static_cast<float*>(d_at), cols, sd, count);
    if (status != CUBLAS_STATUS_SUCCESS)
      check(status, fmt::format("{} '{}': {} ({} x {} by {} x {}, {} "
                                "batches{}{})",
                                a.op_type, a.name,
                                bf16 ? "cublasGemmStridedBatchedEx (16-bit)"
                                     : "cublasSgemmStridedBatched",
                                rows, inner, inner, cols, count,
                                l.transposed ? ", L transposed" : "",
                                r.transposed ? ", R transposed" : ""));
  }
}

void scale(const KernelArgs& a, float* x, int64_t n, float alpha) {
  if (n <= 0 || alpha == 1.0f) return;
  const cublasStatus_t status = cublasSscal_64(context(a).cublas(), n, &alpha, x, 1);
  if (status != CUBLAS_STATUS_SUCCESS)
    check(status, fmt::format("{} '{}': cublasSscal ({} elements)", a.op_type, a.name, n));
}

}  // namespace stagecraft::rt::cuda
