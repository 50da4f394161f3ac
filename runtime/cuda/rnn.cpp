// The CUDA backend's recurrent family (families.h): LSTM, GRU and RNN and their gradients over
// the same nodes as the CPU backend's rnn.cpp, through the same time loop (runtime/ops/
// rnn_core.h) with cuBLAS for the products and rnn_kernels.cu for the steps and column sums.
// sequence_lens, when given, is read to the host and must be T for every sequence, as on the
// CPU.
#include <fmt/format.h>

#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/rnn_kernels.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/rnn_core.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;
using ops::RnnGeometry;
using ops::RnnOperands;

class CudaRnnOps {
 public:
  explicit CudaRnnOps(const KernelArgs& a) : a_(a), ctx_(context(a)) {}

  float* alloc(int64_t n) {
    return buffers_.emplace_back(ctx_.new_tensor(DType::kFloat32, {n}, false)).as<float>();
  }
  void zero(float* p, int64_t n) {
    if (n > 0)
      check(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(float), ctx_.stream()),
            "cudaMemsetAsync");
  }
  void copy2d(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols,
              int64_t rows) {
    copy_rows(ctx_, dst, dst_stride * 4, src, src_stride * 4, cols * 4, rows);
  }
  // Row-major C [m, n] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's m = n,
  // n = m, A = B and B = A, each with the same transpose flag.
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    const cublasStatus_t status = cublasSgemm_64(ctx_.cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                 ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                                                 ldb, a, lda, &beta, c, ldc);
    if (status != CUBLAS_STATUS_SUCCESS)
      check(status,
            fmt::format("{} '{}': cublasSgemm ({} x {} x {})", a_.op_type, a_.name, m, n, k));
  }
  void forward(const ops::RnnForwardStep& s, int phase, int64_t n) {
    launch_rnn_forward(s, phase, n, ctx_.stream());
    check_launch(a_);
  }
  void backward(const ops::RnnBackwardStep& s, int phase, int64_t n) {
    launch_rnn_backward(s, phase, n, ctx_.stream());
    check_launch(a_);
  }
  void colsum(const float* src, int64_t rows, int64_t cols, float* dst) {
    launch_column_sums(src, rows, cols, dst, ctx_.stream());
    check_launch(a_);
  }

 private:
  const KernelArgs& a_;
  CudaContext& ctx_;
  std::vector<Tensor> buffers_;
};

void rnn(const KernelArgs& a) {
  const RnnGeometry g =
      ops::rnn_geometry(a, [&](size_t k) { return a.has_input(k) ? &a.in[k]->shape : nullptr; });
  const RnnOperands t = ops::rnn_forward_operands(
      a, g, [&](const Tensor& lens) { return read_ints(context(a), lens); });
  CudaRnnOps ops(a);
  ops::rnn_run(ops, g, t, false);
}

void rnn_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kRnnGradArity);
  const RnnGeometry g =
      ops::rnn_geometry(a, [&](size_t k) { return io.x(k) ? &io.x(k)->shape : nullptr; });
  const RnnOperands t = ops::rnn_grad_operands(
      a, io, g, [&](const Tensor& lens) { return read_ints(context(a), lens); });
  CudaRnnOps ops(a);
  ops::rnn_run(ops, g, t, true);
}

constexpr KernelEntry kKernels[] = {
    {"LSTM", rnn, same_as_cpu},
    {"GRU", rnn, same_as_cpu},
    {"RNN", rnn, same_as_cpu},
    {"LSTMGrad", rnn_grad, same_as_cpu, /*writes_every_output=*/true},
    {"GRUGrad", rnn_grad, same_as_cpu, /*writes_every_output=*/true},
    {"RNNGrad", rnn_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> rnn_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
