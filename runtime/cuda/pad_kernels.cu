// The CUDA pad family's device kernels (pad_kernels.h): grid-stride loops with int64 indices
// around pad_element.h's per-element functions; Pad moves elements as opaque unsigned values of
// their size.
#include <cstring>

#include "runtime/cuda/pad_kernels.h"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

template <class T>
__global__ void pad_kernel(T* y, const T* x, T value, int64_t n, PadTables tables) {
  for (int64_t e = first_index(); e < n; e += grid_stride())
    y[e] = pad_element(tables, x, value, e);
}

__global__ void pad_grad_kernel(float* dx, const float* dy, int64_t n, PadTables tables) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = pad_grad_element(tables, dy, i);
}

template <class T>
void launch_pad_as(void* y, const void* x, uint64_t value, int64_t n, const PadTables& tables,
                   cudaStream_t stream) {
  T v;
  std::memcpy(&v, &value, sizeof(T));  // the low bytes (little-endian)
  pad_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      static_cast<T*>(y), static_cast<const T*>(x), v, n, tables);
}

}  // namespace

void launch_pad(void* y, const void* x, int64_t element_bytes, uint64_t value, int64_t n,
                const PadTables& tables, cudaStream_t stream) {
  if (n <= 0) return;
  switch (element_bytes) {
    case 1:
      return launch_pad_as<uint8_t>(y, x, value, n, tables, stream);
    case 4:
      return launch_pad_as<uint32_t>(y, x, value, n, tables, stream);
    case 8:
      return launch_pad_as<uint64_t>(y, x, value, n, tables, stream);
    default:
      return;  // the host refuses other sizes
  }
}

void launch_pad_grad(float* dx, const float* dy, int64_t n, const PadTables& tables,
                     cudaStream_t stream) {
  if (n <= 0) return;
  pad_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dx, dy, n, tables);
}

}  // namespace stagecraft::rt::cuda
