// The CUDA backend's recurrent family (families.h): LSTM, GRU and RNN and their gradients over
// the same nodes as the CPU backend's rnn.cpp, through the same time loop (runtime/cpu/
// rnn_core.h) with cuBLAS for the products and rnn_kernels.cu for the steps and column sums.
// sequence_lens, when given, is read to the host and must be T for every sequence, as on the
// CPU.
#include <fmt/format.h>

#include <vector>

#include "runtime/cpu/grad_io.h"
#include "runtime/cpu/rnn_core.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/rnn_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

using cpu::GradIo;
using cpu::RnnGeometry;
using cpu::RnnOperands;

constexpr cpu::GradArity kArity{.n_min = 3, .n_max = 8, .m_min = 1, .m_max = 3};

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
    const cublasStatus_t status = cublasSgemm_64(
        ctx_.cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
        &alpha, b, ldb, a, lda, &beta, c, ldc);
    if (status != CUBLAS_STATUS_SUCCESS)
      check(status, fmt::format("{} '{}': cublasSgemm ({} x {} x {})", a_.op_type, a_.name, m, n,
                                k));
  }
  void forward(const RnnForwardStep& s, int phase, int64_t n) {
    launch_rnn_forward(s, phase, n, ctx_.stream());
    check_launch(a_);
  }
  void backward(const RnnBackwardStep& s, int phase, int64_t n) {
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

const float* ptr(const Tensor* t) { return t ? t->as<float>() : nullptr; }
float* mut(Tensor* t) { return t ? t->as<float>() : nullptr; }

void check_lens(const KernelArgs& a, const RnnGeometry& g, const Tensor* lens) {
  if (lens != nullptr) cpu::check_sequence_lens(a, g, read_ints(context(a), *lens));
}

void rnn(const KernelArgs& a) {
  const RnnGeometry g =
      cpu::rnn_geometry(a, [&](size_t k) { return a.has_input(k) ? &a.in[k]->shape : nullptr; });
  check_lens(a, g, a.has_input(4) ? a.in[4] : nullptr);
  auto out = [&](size_t k) { return k < a.out.size() ? a.out[k] : nullptr; };
  if (out(0)) expect_shape(a, 0, cpu::rnn_y_shape(g));
  if (out(1)) expect_shape(a, 1, cpu::rnn_state_shape(g));
  if (out(2)) expect_shape(a, 2, cpu::rnn_state_shape(g));
  RnnOperands t;
  t.x = ptr(a.in[0]);
  t.w = ptr(a.in[1]);
  t.r = ptr(a.in[2]);
  t.b = a.has_input(3) ? ptr(a.in[3]) : nullptr;
  t.h0 = a.has_input(5) ? ptr(a.in[5]) : nullptr;
  t.c0 = g.has_c0 ? ptr(a.in[6]) : nullptr;
  t.p = g.has_p ? ptr(a.in[7]) : nullptr;
  t.y = mut(out(0));
  t.yh = mut(out(1));
  t.yc = g.kind == RnnKind::kLstm ? mut(out(2)) : nullptr;
  CudaRnnOps ops(a);
  cpu::rnn_run(ops, g, t, false);
}

void rnn_grad(const KernelArgs& a) {
  const GradIo io(a, kArity);
  const RnnGeometry g =
      cpu::rnn_geometry(a, [&](size_t k) { return io.x(k) ? &io.x(k)->shape : nullptr; });
  check_lens(a, g, io.x(4));
  if (io.dy(0)) expect_dy_shape(a, *io.dy(0), cpu::rnn_y_shape(g));
  if (io.dy(1)) expect_dy_shape(a, *io.dy(1), cpu::rnn_state_shape(g));
  if (io.dy(2)) expect_dy_shape(a, *io.dy(2), cpu::rnn_state_shape(g));
  for (size_t k = 0; k < io.n; ++k) {
    if (!io.wants(k)) continue;
    if (k == 4 || io.x(k) == nullptr)
      fail(ErrorKind::kModel, "{} '{}': a gradient of input {}, which has none", a.op_type,
           a.name, k);
    expect_shape(a, k, io.x(k)->shape);
  }
  RnnOperands t;
  t.x = ptr(io.x(0));
  t.w = ptr(io.x(1));
  t.r = ptr(io.x(2));
  t.b = ptr(io.x(3));
  t.h0 = ptr(io.x(5));
  t.c0 = g.has_c0 ? ptr(io.x(6)) : nullptr;
  t.p = g.has_p ? ptr(io.x(7)) : nullptr;
  t.dy = ptr(io.dy(0));
  t.dyh = ptr(io.dy(1));
  t.dyc = g.kind == RnnKind::kLstm ? ptr(io.dy(2)) : nullptr;
  t.dx = mut(io.dx(0));
  t.dw = mut(io.dx(1));
  t.dr = mut(io.dx(2));
  t.db = mut(io.dx(3));
  t.dh0 = mut(io.dx(5));
  t.dc0 = g.kind == RnnKind::kLstm ? mut(io.dx(6)) : nullptr;
  t.dp = g.kind == RnnKind::kLstm ? mut(io.dx(7)) : nullptr;
  CudaRnnOps ops(a);
  cpu::rnn_run(ops, g, t, true);
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
