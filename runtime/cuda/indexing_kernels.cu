// The CUDA indexing family's device kernels (indexing_kernels.h): grid-stride loops with int64
// indices around runtime/ops/indexing_element.h's functions, which the CPU backend runs too.
#include "runtime/cuda/indexing_kernels.h"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

template <class T>
__global__ void tile_kernel(T* y, const T* x, int64_t n, ops::TileShape shape) {
  for (int64_t e = first_index(); e < n; e += grid_stride()) y[e] = x[ops::tile_source(shape, e)];
}

template <class T>
__global__ void scan_kernel(T* y, const T* x, ops::ScanShape shape) {
  const int64_t lines = shape.lines();
  for (int64_t l = first_index(); l < lines; l += grid_stride()) ops::scan_line(shape, x, y, l);
}

template <class T>
__global__ void gather_elements_kernel(T* y, const T* data, int64_t n,
                                       ops::GatherElementsShape shape, const int64_t* indices) {
  for (int64_t e = first_index(); e < n; e += grid_stride())
    y[e] = data[ops::gather_elements_source(shape, indices, e)];
}

__global__ void gather_elements_grad_kernel(float* dx, const float* dy, int64_t n,
                                            ops::GatherElementsShape shape,
                                            const int64_t* indices) {
  for (int64_t p = first_index(); p < n; p += grid_stride())
    dx[p] = ops::gather_elements_grad_element(shape, indices, dy, p);
}

template <class T>
__global__ void scatter_nd_kernel(T* y, const T* data, const T* updates, int64_t n,
                                  ops::ScatterPlan plan) {
  for (int64_t e = first_index(); e < n; e += grid_stride())
    y[e] = ops::scatter_nd_element(plan, data, updates, e);
}

__global__ void scatter_nd_grad_kernel(float* d_data, int64_t n_data, float* d_updates,
                                       int64_t n_updates, const float* dy, ops::ScatterPlan plan) {
  const int64_t n = n_data > n_updates ? n_data : n_updates;
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    if (d_data != nullptr && e < n_data) d_data[e] = ops::scatter_nd_data_grad(plan, dy, e);
    if (d_updates != nullptr && e < n_updates)
      d_updates[e] = ops::scatter_nd_updates_grad(plan, dy, e);
  }
}

// Calls `body(T{})` with the unsigned type of `bytes` bytes (1, 2, 4 or 8).
template <class Body>
void by_size(int64_t bytes, Body&& body) {
  switch (bytes) {
    case 1:
      return body(uint8_t{});
    case 2:
      return body(uint16_t{});
    case 4:
      return body(uint32_t{});
    case 8:
      return body(uint64_t{});
    default:
      return;  // the host refuses other sizes
  }
}

template <class Body>
void by_number(NumberType type, Body&& body) {
  switch (type) {
    case NumberType::kFloat32:
      return body(float{});
    case NumberType::kFloat64:
      return body(double{});
    case NumberType::kInt32:
      return body(int32_t{});
    case NumberType::kInt64:
      return body(int64_t{});
  }
}

}  // namespace

void launch_tile(void* y, const void* x, int64_t element_bytes, int64_t n,
                 const ops::TileShape& shape, cudaStream_t stream) {
  if (n <= 0) return;
  by_size(element_bytes, [&](auto tag) {
    using T = decltype(tag);
    tile_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), n, shape);
  });
}

void launch_scan(void* y, const void* x, NumberType type, const ops::ScanShape& shape,
                 cudaStream_t stream) {
  const int64_t lines = shape.lines();
  if (lines <= 0 || shape.length <= 0) return;
  by_number(type, [&](auto tag) {
    using T = decltype(tag);
    scan_kernel<T><<<grid_for(lines, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), shape);
  });
}

void launch_gather_elements(void* y, const void* data, int64_t element_bytes, int64_t n,
                            const ops::GatherElementsShape& shape, const int64_t* indices,
                            cudaStream_t stream) {
  if (n <= 0) return;
  by_size(element_bytes, [&](auto tag) {
    using T = decltype(tag);
    gather_elements_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(data), n, shape, indices);
  });
}

void launch_gather_elements_grad(float* dx, const float* dy, int64_t n,
                                 const ops::GatherElementsShape& shape, const int64_t* indices,
                                 cudaStream_t stream) {
  if (n <= 0) return;
  gather_elements_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dx, dy, n, shape,
                                                                               indices);
}

void launch_scatter_nd(void* y, const void* data, const void* updates, int64_t element_bytes,
                       NumberType type, int64_t n, const ops::ScatterPlan& plan,
                       cudaStream_t stream) {
  if (n <= 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    scatter_nd_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(data), static_cast<const T*>(updates), n, plan);
  };
  if (plan.reduction == ops::ScatterReduction::kNone)
    by_size(element_bytes, run);
  else
    by_number(type, run);
}

void launch_scatter_nd_grad(float* d_data, int64_t n_data, float* d_updates, int64_t n_updates,
                            const float* dy, const ops::ScatterPlan& plan, cudaStream_t stream) {
  const int64_t n = n_data > n_updates ? n_data : n_updates;
  if (n <= 0) return;
  scatter_nd_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(d_data, n_data,
                                                                          d_updates, n_updates,
                                                                          dy, plan);
}

}  // namespace stagecraft::rt::cuda
