// The CUDA data family's device kernels (data_kernels.h): grid-stride loops with int64 indices;
// elements moved as opaque units of their size; reductions one block per output where the
// reduced extent is long, one thread per output where it is short, both in a fixed order.
#include <cstdint>

#include "runtime/cuda/column_reduce.cuh"
#include "runtime/cuda/data_kernels.h"
#include "runtime/cuda/norm_block.cuh"
#include "runtime/cuda/update_kernels.h"
#include "runtime/ops/trilu_element.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

// An element of N bytes moved as one value.
template <int N>
struct alignas(N) Unit {
  unsigned char bytes[N];
};

__device__ __forceinline__ int64_t map_offset(const IndexMap& map, int64_t i) {
  int64_t offset = 0;
  for (int d = map.rank - 1; d >= 0; --d) {
    offset += (i % map.dims[d]) * map.strides[d];
    i /= map.dims[d];
  }
  return offset;
}

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

template <class T>
__global__ void strided_gather_kernel(T* dst, const T* src, int64_t n, IndexMap map) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = src[map_offset(map, i)];
}

template <class T>
__global__ void strided_scatter_kernel(T* dst, const T* src, int64_t n, IndexMap map) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[map_offset(map, i)] = src[i];
}

template <class T>
__global__ void gather_kernel(T* out, const T* data, const int64_t* indices, int64_t outer,
                              int64_t count, int64_t dim, int64_t inner) {
  const int64_t n = outer * count * inner;
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const int64_t j = e % inner, row = e / inner;
    const int64_t i = row % count, o = row / count;
    out[e] = data[(o * dim + indices[i]) * inner + j];
  }
}

// A block per row (o, d) of dx (grid-stride over the outer * dim rows), its threads along the
// row's inner elements: no division per element (GPT-2's embedding gradient, 38.6 M elements,
// took 340 us a launch on an H200 with two 64-bit divisions each). Each element sums the rows of
// dy that gathered it in position order, as before.
__global__ void gather_grad_kernel(float* dx, const float* dy, const int64_t* offsets,
                                   const int64_t* positions, int64_t outer, int64_t count,
                                   int64_t dim, int64_t inner) {
  const int64_t rows = outer * dim;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t d = row % dim, o = row / dim;
    const int64_t first = offsets[d], last = offsets[d + 1];
    float* out = dx + row * inner;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      float sum = 0.0f;
      for (int64_t p = first; p < last; ++p) sum += dy[(o * count + positions[p]) * inner + j];
      out[j] = sum;
    }
  }
}

// How a reduced sum of T accumulates and how its mean is formed.
template <class T>
struct Accumulate {
  using type = double;
  __device__ static T mean(double sum, int64_t count) {
    return static_cast<T>(sum / static_cast<double>(count));
  }
};
template <>
struct Accumulate<int32_t> {
  using type = long long;
  __device__ static int32_t mean(long long sum, int64_t count) {
    return static_cast<int32_t>(sum / count);
  }
};
template <>
struct Accumulate<int64_t> {
  using type = long long;
  __device__ static int64_t mean(long long sum, int64_t count) {
    return static_cast<int64_t>(sum / count);
  }
};

template <class T, bool kMean>
__device__ __forceinline__ T finish(typename Accumulate<T>::type sum, int64_t count) {
  if constexpr (kMean)
    return Accumulate<T>::mean(sum, count);
  else
    return static_cast<T>(sum);
}

// One thread per output, the reduced elements in ascending order.
template <class T, bool kMean>
__global__ void reduce_thread_kernel(T* out, const T* in, int64_t n_out, ReduceMap map) {
  using Acc = typename Accumulate<T>::type;
  for (int64_t o = first_index(); o < n_out; o += grid_stride()) {
    const T* base = in + map_offset(map.kept, o);
    Acc sum = 0;
    for (int64_t r = 0; r < map.count; ++r)
      sum += static_cast<Acc>(base[map_offset(map.reduced, r)]);
    out[o] = finish<T, kMean>(sum, map.count);
  }
}

// One block per output: each thread sums a strided share, then a fixed tree adds the shares.
template <class T, bool kMean>
__global__ void reduce_block_kernel(T* out, const T* in, int64_t n_out, ReduceMap map) {
  using Acc = typename Accumulate<T>::type;
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    const T* base = in + map_offset(map.kept, o);
    Acc sum = 0;
    for (int64_t r = threadIdx.x; r < map.count; r += blockDim.x)
      sum += static_cast<Acc>(base[map_offset(map.reduced, r)]);
    sum = block_sum<Acc>(sum);
    if (threadIdx.x == 0) out[o] = finish<T, kMean>(sum, map.count);
  }
}

template <class T, bool kMean>
void launch_reduce(T* out, const T* in, int64_t n_out, const ReduceMap& map, cudaStream_t stream) {
  if (n_out <= 0) return;
  // Long reductions over few outputs go a block per output; the rest a thread per output.
  if (map.count >= 64 && n_out < int64_t{1} << 20) {
    const unsigned blocks = static_cast<unsigned>(n_out < 65535 * 16 ? n_out : 65535 * 16);
    reduce_block_kernel<T, kMean><<<blocks, kThreads, 0, stream>>>(out, in, n_out, map);
  } else {
    reduce_thread_kernel<T, kMean>
        <<<grid_for(n_out, kThreads), kThreads, 0, stream>>>(out, in, n_out, map);
  }
}

// Trilu (and its gradient on float32): src's elements inside the triangle, zero outside.
template <class T>
__global__ void trilu_kernel(T* dst, const T* src, int64_t n, ops::TriluShape shape) {
  for (int64_t e = first_index(); e < n; e += grid_stride())
    dst[e] = ops::trilu_keeps(shape, e) ? src[e] : T{};
}

__global__ void broadcast_scale_kernel(float* dst, const float* src, int64_t n, IndexMap map,
                                       float scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = src[map_offset(map, i)] * scale;
}

// Calls body(Unit<size>{}) for a unit of 1, 2, 4, 8 or 16 bytes (the host checks the size).
template <class Body>
void by_unit(int64_t size, Body&& body) {
  switch (size) {
    case 1:
      body(Unit<1>{});
      break;
    case 2:
      body(Unit<2>{});
      break;
    case 4:
      body(Unit<4>{});
      break;
    case 8:
      body(Unit<8>{});
      break;
    case 16:
      body(Unit<16>{});
      break;
    default:
      break;
  }
}

}  // namespace

namespace {

// The same move in 16-byte units where it allows them: the walk's innermost dim contiguous
// and a whole number of units long, every other stride a whole number of units, both pointers
// 16-byte aligned (a transpose that keeps the last dim, as attention's head transposes do, or
// a slice of whole rows). Each thread then moves 16 bytes, with one offset computation, rather
// than one element. Changes `map`, `n` and `element_bytes` in place; false leaves them.
bool in_units_of_16(const void* dst, const void* src, int64_t& element_bytes, int64_t& n,
                    IndexMap& map) {
  if (element_bytes >= 16 || 16 % element_bytes != 0 || map.rank < 1) return false;
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    return false;
  const int64_t per = 16 / element_bytes;
  const int last = map.rank - 1;
  if (map.strides[last] != 1 || map.dims[last] % per != 0) return false;
  for (int d = 0; d < last; ++d)
    if (map.strides[d] % per != 0) return false;
  for (int d = 0; d < last; ++d) map.strides[d] /= per;
  map.dims[last] /= per;
  n /= per;
  element_bytes = 16;
  return true;
}

}  // namespace

void launch_strided_gather(void* dst, const void* src, int64_t element_bytes, int64_t n,
                           const IndexMap& given, cudaStream_t stream) {
  if (n <= 0) return;
  IndexMap map = given;
  in_units_of_16(dst, src, element_bytes, n, map);
  by_unit(element_bytes, [&](auto unit) {
    using T = decltype(unit);
    strided_gather_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), n, map);
  });
}

void launch_strided_scatter(void* dst, const void* src, int64_t element_bytes, int64_t n,
                            const IndexMap& given, cudaStream_t stream) {
  if (n <= 0) return;
  IndexMap map = given;
  in_units_of_16(dst, src, element_bytes, n, map);
  by_unit(element_bytes, [&](auto unit) {
    using T = decltype(unit);
    strided_scatter_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), n, map);
  });
}

void launch_trilu(void* dst, const void* src, int64_t element_bytes, int64_t n,
                  const ops::TriluShape& shape, cudaStream_t stream) {
  if (n <= 0) return;
  by_unit(element_bytes, [&](auto unit) {
    using T = decltype(unit);
    trilu_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), n, shape);
  });
}

void launch_gather(void* out, const void* data, const int64_t* indices, int64_t outer,
                   int64_t count, int64_t dim, int64_t inner, int64_t unit_bytes,
                   cudaStream_t stream) {
  const int64_t n = outer * count * inner;
  if (n <= 0) return;
  by_unit(unit_bytes, [&](auto unit) {
    using T = decltype(unit);
    gather_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(data), indices, outer, count, dim, inner);
  });
}

void launch_gather_grad(float* dx, const float* dy, const int64_t* offsets,
                        const int64_t* positions, int64_t outer, int64_t count, int64_t dim,
                        int64_t inner, cudaStream_t stream) {
  const int64_t n = outer * dim * inner;
  if (n <= 0) return;
  const int64_t rows = outer * dim;
  const unsigned blocks = static_cast<unsigned>(rows < 65535 * 64 ? rows : 65535 * 64);
  gather_grad_kernel<<<blocks, kThreads, 0, stream>>>(dx, dy, offsets, positions, outer, count, dim,
                                                      inner);
}

void launch_reduce_mean_f32(float* out, const float* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream) {
  launch_reduce<float, true>(out, in, n_out, map, stream);
}
void launch_reduce_mean_f64(double* out, const double* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream) {
  launch_reduce<double, true>(out, in, n_out, map, stream);
}
void launch_reduce_mean_i32(int32_t* out, const int32_t* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream) {
  launch_reduce<int32_t, true>(out, in, n_out, map, stream);
}
void launch_reduce_mean_i64(int64_t* out, const int64_t* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream) {
  launch_reduce<int64_t, true>(out, in, n_out, map, stream);
}
void launch_reduce_sum_f32(float* out, const float* in, int64_t n_out, const ReduceMap& map,
                           cudaStream_t stream) {
  launch_reduce<float, false>(out, in, n_out, map, stream);
}

namespace {

struct ColumnTerm {
  static constexpr int kTerms = 1;
  const float* in;
  int64_t row_stride;
  __device__ void operator()(int64_t r, int64_t c, double (&t)[1]) const {
    t[0] = in[r * row_stride + c];
  }
};

struct ColumnStore {
  float* out;
  __device__ void operator()(int, int64_t c, double sum) const { out[c] = static_cast<float>(sum); }
};

}  // namespace

void launch_column_sum_f32(float* out, const float* in, int64_t rows, int64_t cols,
                           int64_t row_stride, double* partial, int64_t slices,
                           cudaStream_t stream) {
  launch_column_reduce(ColumnTerm{in, row_stride}, ColumnStore{out}, rows, cols, partial, slices,
                       stream);
}

void launch_broadcast_scale(float* dst, const float* src, int64_t n, const IndexMap& map,
                            float scale, cudaStream_t stream) {
  if (n <= 0) return;
  broadcast_scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n, map, scale);
}

}  // namespace stagecraft::rt::cuda
