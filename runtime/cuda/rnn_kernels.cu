// The CUDA recurrent family's device kernels (rnn_kernels.h): grid-stride loops with int64
// indices around rnn_element.h's per-element functions, and a column sum per thread.
#include "runtime/cuda/rnn_kernels.h"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

__global__ void forward_kernel(ops::RnnForwardStep step, int phase, int64_t n) {
  for (int64_t e = first_index(); e < n; e += grid_stride())
    ops::rnn_forward_element(step, phase, e);
}

__global__ void backward_kernel(ops::RnnBackwardStep step, int phase, int64_t n) {
  for (int64_t e = first_index(); e < n; e += grid_stride())
    ops::rnn_backward_element(step, phase, e);
}

__global__ void column_sums_kernel(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t c = first_index(); c < cols; c += grid_stride()) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) sum += src[r * cols + c];
    dst[c] = static_cast<float>(sum);
  }
}

}  // namespace

void launch_rnn_forward(const ops::RnnForwardStep& step, int phase, int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return;
  forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(step, phase, n);
}

void launch_rnn_backward(const ops::RnnBackwardStep& step, int phase, int64_t n,
                         cudaStream_t stream) {
  if (n <= 0) return;
  backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(step, phase, n);
}

void launch_column_sums(const float* src, int64_t rows, int64_t cols, float* dst,
                        cudaStream_t stream) {
  if (cols <= 0) return;
  column_sums_kernel<<<grid_for(cols, kThreads), kThreads, 0, stream>>>(src, rows, cols, dst);
}

}  // namespace stagecraft::rt::cuda
