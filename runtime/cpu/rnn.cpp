// LSTM, GRU and RNN and their gradients on float32 (the node's rules and the time loop:
// rnn_core.h; the per-element steps: rnn_element.h). The matrix products are oneDNN's sgemm
// (row-major, threaded), the steps plain OpenMP loops. oneDNN's RNN primitives are not used:
// they take their own gate orders and weight layouts, bidirectional output concatenated along
// the features and a workspace that only their forward-training pass fills, while the gradient
// op here gets the forward's inputs and outputs alone; one loop over sgemm serves the three
// families, both directions and the gradient, and the CUDA backend runs the same loop on cuBLAS.
#include <oneapi/dnnl/dnnl.h>

#include <cstring>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/rnn_core.h"

namespace stagecraft::rt::cpu {
namespace {

class CpuRnnOps {
 public:
  explicit CpuRnnOps(const KernelArgs& a) : a_(a), ctx_(context(a)) {}

  float* alloc(int64_t n) {
    return buffers_.emplace_back(ctx_.new_tensor(DType::kFloat32, {n}, false)).as<float>();
  }
  void zero(float* p, int64_t n) {
    if (n > 0) std::memset(p, 0, static_cast<size_t>(n) * sizeof(float));
  }
  void copy2d(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols,
              int64_t rows) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(cols) * 4);
  }
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) !=
        dnnl_success)
      fail(ErrorKind::kInternal, "{} '{}': oneDNN's sgemm failed ({} x {} x {})", a_.op_type,
           a_.name, m, n, k);
  }
  void forward(const ops::RnnForwardStep& s, int phase, int64_t n) {
#pragma omp parallel for if (n > 4096)
    for (int64_t e = 0; e < n; ++e) ops::rnn_forward_element(s, phase, e);
  }
  void backward(const ops::RnnBackwardStep& s, int phase, int64_t n) {
#pragma omp parallel for if (n > 4096)
    for (int64_t e = 0; e < n; ++e) ops::rnn_backward_element(s, phase, e);
  }
  void colsum(const float* src, int64_t rows, int64_t cols, float* dst) {
#pragma omp parallel for if (rows * cols > 32768)
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += src[r * cols + c];
      dst[c] = static_cast<float>(sum);
    }
  }

 private:
  const KernelArgs& a_;
  CpuContext& ctx_;
  std::vector<Tensor> buffers_;
};

void rnn(const KernelArgs& a) {
  const ops::RnnGeometry g =
      ops::rnn_geometry(a, [&](size_t k) { return a.has_input(k) ? &a.in[k]->shape : nullptr; });
  const ops::RnnOperands t = ops::rnn_forward_operands(
      a, g, [&](const Tensor& lens) { return ops::read_ints(a, lens, 4); });
  CpuRnnOps ops(a);
  ops::rnn_run(ops, g, t, false);
}

void rnn_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kRnnGradArity);
  const ops::RnnGeometry g =
      ops::rnn_geometry(a, [&](size_t k) { return io.x(k) ? &io.x(k)->shape : nullptr; });
  const ops::RnnOperands t = ops::rnn_grad_operands(
      a, io, g, [&](const Tensor& lens) { return ops::read_ints(a, lens, 4); });
  CpuRnnOps ops(a);
  ops::rnn_run(ops, g, t, true);
}

// Float32 operands (sequence_lens int32 or int64) and attributes the kernels take.
std::string check_operands(const OpSignature& s, size_t lens_position) {
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    if (s.inputs[k] == DType::kUndefined) continue;
    if (k == lens_position) {
      if (s.inputs[k] != DType::kInt32 && s.inputs[k] != DType::kInt64)
        return fmt::format("{} sequence_lens is {}, expected int32 or int64", s.op_type,
                           dtype_name(s.inputs[k]));
    } else if (s.inputs[k] != DType::kFloat32) {
      return fmt::format("{} on {} input {} is not supported; the kernels run float32", s.op_type,
                         dtype_name(s.inputs[k]), k);
    }
  }
  for (DType d : s.outputs)
    if (d != DType::kUndefined && d != DType::kFloat32)
      return fmt::format("{} with a {} output is not supported", s.op_type, dtype_name(d));
  return ops::rnn_attribute_error(s.op_type, s.attrs);
}

std::string check_rnn(const OpSignature& s) {
  const size_t most = ops::rnn_kind(s.op_type) == ops::RnnKind::kLstm ? 8 : 6;
  if (s.inputs.size() < 3 || s.inputs.size() > most || s.inputs[0] == DType::kUndefined ||
      s.inputs[1] == DType::kUndefined || s.inputs[2] == DType::kUndefined)
    return fmt::format("{} needs inputs X, W and R and at most {} inputs", s.op_type, most);
  return check_operands(s, 4);
}

std::string check_rnn_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, ops::kRnnGradArity); !why.empty()) return why;
  // Operand 4 is sequence_lens only when the forward node had 5 inputs or more.
  const bool lens = s.attrs.i(grad::kForwardInputsAttr, 0) > 4;
  return check_operands(s, lens ? 4 : s.inputs.size());
}

constexpr KernelEntry kKernels[] = {
    {"LSTM", rnn, check_rnn},
    {"GRU", rnn, check_rnn},
    {"RNN", rnn, check_rnn},
    {"LSTMGrad", rnn_grad, check_rnn_grad, /*writes_every_output=*/true},
    {"GRUGrad", rnn_grad, check_rnn_grad, /*writes_every_output=*/true},
    {"RNNGrad", rnn_grad, check_rnn_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> rnn_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
