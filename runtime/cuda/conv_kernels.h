#pragma once
/// \file
/// Device kernels of the CUDA conv family (conv_kernels.cu) on dense NCHW tensors: N * C
/// "planes", each its spatial dims row-major, front-filled to three dims (conv_window.h), so
/// one kernel serves 1-D to 3-D. Pooling and its gradients run one thread per output (forward)
/// or input (gradient) element with ONNX's semantics (ceil_mode, dilations, asymmetric pads,
/// the divisor of count_include_pad) computed exactly as the CPU's loops compute them
/// (conv_window.h); the gradients gather instead of scattering with atomics, so a run is
/// reproducible and adds in the CPU's order. Every launch is queued on `stream`; the host side
/// (conv.cpp, grad_conv.cpp) checks shapes.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/cuda/conv_window.h"
#include "runtime/format/dtype.h"

namespace stagecraft::rt::cuda {

/// The element types MaxPool takes (the CPU's: float32, int8, uint8).
enum class PoolElement { kFloat32, kInt8, kUInt8 };

/// MaxPool: y = the first maximum of each window (window order d, h, w). When `indices` is
/// not null it gets each maximum's flat index into X: plane * in_plane + the spatial offset,
/// row-major or, with `column_major` (storage_order 1), column-major.
void launch_max_pool(PoolElement element, const void* x, void* y, int64_t* indices,
                     bool column_major, const PoolShape& shape, cudaStream_t stream);

/// AveragePool: the window's sum (in float, window order) over the positions inside the input,
/// or with `include_pad` over those inside the explicitly padded input.
void launch_average_pool(const float* x, float* y, bool include_pad, const PoolShape& shape,
                         cudaStream_t stream);

/// GlobalAveragePool: y[p] = the mean of plane p's `size` values (summed in double).
void launch_global_average_pool(const float* x, float* y, int64_t planes, int64_t size,
                                cudaStream_t stream);

/// MaxPoolGrad: dx (overwritten) gets, at each window's first maximum of x (recomputed as the
/// forward picks it), the window's dy, summed over the windows in output order.
/// `argmax` is scratch of planes * out_plane int64 values.
void launch_max_pool_grad(const float* x, const float* dy, float* dx, int64_t* argmax,
                          const PoolShape& shape, cudaStream_t stream);

/// AveragePoolGrad: dx (overwritten) = the sum over the windows holding each element, in output
/// order, of dy / the window's divisor.
void launch_average_pool_grad(const float* dy, float* dx, bool include_pad, const PoolShape& shape,
                              cudaStream_t stream);

/// GlobalAveragePoolGrad: dx[p, i] = dy[p] / size.
void launch_global_average_pool_grad(const float* dy, float* dx, int64_t planes, int64_t size,
                                     cudaStream_t stream);

/// A zero-padding of `planes` planes: `in` front-filled spatial sizes grow by `before` and
/// `after` zeros per dim into `padded` (= in + before + after).
struct PadShape {
  int64_t planes = 0;
  int64_t in[3] = {1, 1, 1}, padded[3] = {1, 1, 1}, before[3] = {0, 0, 0};
};

/// padded = x with zeros around it (every element of `padded` written); elements of `dtype`
/// (float32, bfloat16 or float16).
void launch_pad(DType dtype, const void* x, void* padded, const PadShape& shape,
                cudaStream_t stream);

/// x = the inner part of `padded` (the inverse of launch_pad; every element of `x` written).
void launch_crop(DType dtype, const void* padded, void* x, const PadShape& shape,
                 cudaStream_t stream);
inline void launch_crop(const float* padded, float* x, const PadShape& shape, cudaStream_t stream) {
  launch_crop(DType::kFloat32, padded, x, shape, stream);
}

/// y[n, m, s] += bias[m] over y as [n, channels, size] (Conv's bias), both of `dtype`: a 16-bit
/// y and bias are added in float32 and rounded once.
void launch_add_channel_bias(DType dtype, void* y, const void* bias, int64_t n, int64_t channels,
                             int64_t size, cudaStream_t stream);
inline void launch_add_channel_bias(float* y, const float* bias, int64_t n, int64_t channels,
                                    int64_t size, cudaStream_t stream) {
  launch_add_channel_bias(DType::kFloat32, y, bias, n, channels, size, stream);
}

/// Slices of the batch for launch_channel_sum: about 1024 blocks in all, each at least one
/// image; from the shape alone, so the sum's order is.
int64_t channel_sum_slices(int64_t n, int64_t channels);

/// db[m] = the sum of dy[n, m, s] over n and s, in double (ConvGrad's bias gradient), dy and db
/// of `dtype` (db rounded once): a block per channel and slice of images (a fixed reduction
/// tree, up to 16 bytes a read), then the slices' sums added in slice order from `partial`
/// (slices * channels doubles of scratch; null, or one slice: a block per channel, no scratch).
void launch_channel_sum(DType dtype, const void* dy, void* db, int64_t n, int64_t channels,
                        int64_t size, double* partial, int64_t slices, cudaStream_t stream);
inline void launch_channel_sum(DType dtype, const void* dy, void* db, int64_t n, int64_t channels,
                               int64_t size, cudaStream_t stream) {
  launch_channel_sum(dtype, dy, db, n, channels, size, nullptr, 1, stream);
}
inline void launch_channel_sum(const float* dy, float* db, int64_t n, int64_t channels,
                               int64_t size, cudaStream_t stream) {
  launch_channel_sum(DType::kFloat32, dy, db, n, channels, size, stream);
}

}  // namespace stagecraft::rt::cuda
