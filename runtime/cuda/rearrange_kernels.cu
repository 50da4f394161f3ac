// The CUDA rearrange family's device kernels (rearrange_kernels.h): grid-stride loops with int64
// indices around runtime/ops/rearrange_element.h's functions, which the CPU backend runs too.
#include "runtime/cuda/rearrange_kernels.h"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

template <class T>
__global__ void space_depth_kernel(T* dst, const T* src, ops::SpaceDepthShape shape, bool gather) {
  const int64_t n = shape.numel();
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    if (gather)
      dst[e] = src[ops::space_to_deep(shape, e)];
    else
      dst[ops::space_to_deep(shape, e)] = src[e];
  }
}

template <class T>
__global__ void topk_kernel(T* values, int64_t* indices, const T* x, ops::TopKShape shape) {
  const int64_t lines = shape.lines();
  for (int64_t line = first_index(); line < lines; line += grid_stride()) {
    T prev_value{};
    int64_t prev = -1;
    for (int64_t r = 0; r < shape.k; ++r) {
      int64_t best = -1;
      T best_value{};
      for (int64_t e = 0; e < shape.length; ++e) {
        const T v = x[ops::topk_offset(shape, line, e)];
        if (prev >= 0 && !ops::topk_before(prev_value, prev, v, e, shape.largest)) continue;
        if (best < 0 || ops::topk_before(v, e, best_value, best, shape.largest)) {
          best = e;
          best_value = v;
        }
      }
      const int64_t o = ops::topk_out_offset(shape, line, r);
      values[o] = best_value;
      indices[o] = best;
      prev = best;
      prev_value = best_value;
    }
  }
}

template <class T>
__global__ void arg_extreme_kernel(int64_t* out, const T* x, ops::TopKShape shape, bool last) {
  const int64_t lines = shape.lines();
  for (int64_t line = first_index(); line < lines; line += grid_stride())
    out[line] = ops::arg_of_line(x, shape, line, last);
}

__global__ void topk_grad_kernel(float* dx, const float* d_values, const int64_t* indices,
                                 ops::TopKShape shape) {
  const int64_t n = shape.lines() * shape.k;
  for (int64_t o = first_index(); o < n; o += grid_stride()) {
    const int64_t line = (o / (shape.k * shape.inner)) * shape.inner + o % shape.inner;
    const int64_t i = indices[o];
    if (i >= 0 && i < shape.length) dx[ops::topk_offset(shape, line, i)] = d_values[o];
  }
}

// run(T{}) for the C++ type of `type`.
template <class Run>
void by_number_type(NumberType type, Run run) {
  switch (type) {
    case NumberType::kFloat32:
      return run(float{});
    case NumberType::kFloat64:
      return run(double{});
    case NumberType::kInt32:
      return run(int32_t{});
    case NumberType::kInt64:
      return run(int64_t{});
  }
}

}  // namespace

void launch_space_depth(void* dst, const void* src, int64_t element_bytes,
                        const ops::SpaceDepthShape& shape, bool gather, cudaStream_t stream) {
  const int64_t n = shape.numel();
  if (n <= 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    space_depth_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), shape, gather);
  };
  switch (element_bytes) {
    case 1:
      return run(uint8_t{});
    case 2:
      return run(uint16_t{});
    case 4:
      return run(uint32_t{});
    case 8:
      return run(uint64_t{});
    default:
      return;  // the host refuses other sizes
  }
}

void launch_topk(void* values, int64_t* indices, const void* x, NumberType type,
                 const ops::TopKShape& shape, cudaStream_t stream) {
  const int64_t lines = shape.lines();
  if (lines <= 0 || shape.k <= 0) return;
  by_number_type(type, [&](auto tag) {
    using T = decltype(tag);
    topk_kernel<T><<<grid_for(lines, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(values), indices, static_cast<const T*>(x), shape);
  });
}

void launch_arg_extreme(int64_t* out, const void* x, NumberType type, const ops::TopKShape& shape,
                        bool last, cudaStream_t stream) {
  const int64_t lines = shape.lines();
  if (lines <= 0 || shape.length <= 0) return;
  by_number_type(type, [&](auto tag) {
    using T = decltype(tag);
    arg_extreme_kernel<T><<<grid_for(lines, kThreads), kThreads, 0, stream>>>(
        out, static_cast<const T*>(x), shape, last);
  });
}

void launch_topk_grad(float* dx, const float* d_values, const int64_t* indices,
                      const ops::TopKShape& shape, cudaStream_t stream) {
  const int64_t n = shape.lines() * shape.k;
  if (n <= 0) return;
  topk_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dx, d_values, indices, shape);
}

}  // namespace stagecraft::rt::cuda
