// The CUDA elementwise gradients' device kernels (grad_eltwise_kernels.h): grid-stride loops
// with int64 indices, one generic unary and one generic broadcasting binary kernel templated on
// the gradient's formula (the CPU backend's grad_eltwise.cpp, in float32).
#include <cmath>
#include <cstdint>

#include "runtime/cuda/elementwise_device.cuh"
#include "runtime/cuda/grad_eltwise_kernels.h"
#include "runtime/cuda/update_kernels.h"
#include "runtime/ops/gelu_element.h"

namespace stagecraft::rt::cuda {
namespace {

using namespace eltwise;

constexpr int kThreads = 256;

// The forward op where a gradient uses its output y and y was not given.
template <UnaryGradOp op>
__device__ __forceinline__ float forward(float x) {
  if constexpr (op == UnaryGradOp::kSigmoid)
    return 1.0f / (1.0f + expf(-x));
  else if constexpr (op == UnaryGradOp::kTanh)
    return tanhf(x);
  else if constexpr (op == UnaryGradOp::kSqrt)
    return sqrtf(x);
  else if constexpr (op == UnaryGradOp::kExp)
    return expf(x);
  else if constexpr (op == UnaryGradOp::kReciprocal)
    return 1.0f / x;
  else
    return x;  // unused
}

template <UnaryGradOp op>
__device__ __forceinline__ float unary_grad_one(float x, float y, float dy,
                                                const UnaryGradParams& p, float lo, float hi) {
  if constexpr (op == UnaryGradOp::kRelu) {
    return x > 0 ? dy : 0.0f;
  } else if constexpr (op == UnaryGradOp::kSigmoid) {
    return dy * y * (1 - y);
  } else if constexpr (op == UnaryGradOp::kTanh) {
    return dy * (1 - y * y);
  } else if constexpr (op == UnaryGradOp::kSqrt) {
    return dy * 0.5f / y;
  } else if constexpr (op == UnaryGradOp::kErf) {
    constexpr float k = 1.12837916709551257390f;  // 2 / sqrt(pi)
    return dy * k * expf(-x * x);
  } else if constexpr (op == UnaryGradOp::kHardSigmoid) {
    const float v = p.alpha * x + p.beta;
    return v > 0 && v < 1 ? p.alpha * dy : 0.0f;
  } else if constexpr (op == UnaryGradOp::kHardSwish) {
    if (x <= -3) return 0.0f;
    if (x >= 3) return dy;
    return dy * (x / 3 + 0.5f);
  } else if constexpr (op == UnaryGradOp::kClip) {
    return x > lo && x < hi ? dy : 0.0f;
  } else if constexpr (op == UnaryGradOp::kLeakyRelu) {
    return x < 0.0f ? p.alpha * dy : dy;
  } else if constexpr (op == UnaryGradOp::kExp) {
    return dy * y;
  } else if constexpr (op == UnaryGradOp::kLog) {
    return dy / x;
  } else if constexpr (op == UnaryGradOp::kReciprocal) {
    return -dy * y * y;
  } else if constexpr (op == UnaryGradOp::kNeg) {
    return -dy;
  } else if constexpr (op == UnaryGradOp::kAbs) {
    return x > 0 ? dy : (x < 0 ? -dy : 0.0f);
  } else if constexpr (op == UnaryGradOp::kZero) {
    return 0.0f;
  } else if constexpr (op == UnaryGradOp::kElu) {
    return x > 0 ? dy : dy * p.alpha * expf(x);
  } else if constexpr (op == UnaryGradOp::kSelu) {
    return x > 0 ? p.gamma * dy : p.gamma * p.alpha * dy * expf(x);
  } else if constexpr (op == UnaryGradOp::kGelu) {
    return dy * ops::gelu_derivative(x);
  } else if constexpr (op == UnaryGradOp::kGeluTanh) {
    return dy * ops::gelu_tanh_derivative(x);
  } else if constexpr (op == UnaryGradOp::kCelu) {
    return x > 0 ? dy : dy * expf(x / p.alpha);
  } else if constexpr (op == UnaryGradOp::kSin) {
    return dy * cosf(x);
  } else if constexpr (op == UnaryGradOp::kCos) {
    return -dy * sinf(x);
  } else {  // kSoftplus
    return dy / (1 + expf(-x));
  }
}

template <UnaryGradOp op>
__global__ void unary_grad_kernel(const float* x, const float* y, const float* dy, float* dx,
                                  int64_t n, UnaryGradParams p) {
  float lo = -INFINITY, hi = INFINITY;
  if constexpr (op == UnaryGradOp::kClip) {
    if (p.lo_attr)
      lo = p.lo;
    else if (p.lo_ptr != nullptr)
      lo = *p.lo_ptr;
    if (p.hi_attr)
      hi = p.hi;
    else if (p.hi_ptr != nullptr)
      hi = *p.hi_ptr;
  }
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    dx[i] = unary_grad_one<op>(v, y != nullptr ? y[i] : forward<op>(v), dy[i], p, lo, hi);
  }
}

template <UnaryGradOp op>
void unary_grad_of(const float* x, const float* y, const float* dy, float* dx, int64_t n,
                   const UnaryGradParams& p, cudaStream_t stream) {
  unary_grad_kernel<op><<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, dy, dx, n, p);
}

// A unary gradient on 16-bit floats: x, y and dy widened exactly, the float32 formula, dx
// rounded to nearest even: the widened fallback's bits (run_widened) without its casts through
// memory. Not Clip, whose bounds are device floats of the input's type.
// One element's dx: y where the node gives it (has_y), else recomputed from x.
template <UnaryGradOp op, class H>
__device__ __forceinline__ H unary_grad16_one(H x, bool has_y, H y, H dy,
                                              const UnaryGradParams& p) {
  const float v = to_float(x);
  const float out = has_y ? to_float(y) : forward<op>(v);
  return convert<H>(unary_grad_one<op>(v, out, to_float(dy), p, -INFINITY, INFINITY));
}

template <UnaryGradOp op, class H>
__global__ void unary_grad16_kernel(const H* x, const H* y, const H* dy, H* dx, int64_t n,
                                    UnaryGradParams p) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = unary_grad16_one<op>(x[i], y != nullptr, y != nullptr ? y[i] : x[i], dy[i], p);
}

// unary_grad16_kernel 16 bytes (8 elements) of each operand a thread, every pointer given
// 16-byte aligned (y may be null): the same bits.
template <UnaryGradOp op, class H>
__global__ void unary_grad16_vector_kernel(const H* x, const H* y, const H* dy, H* dx, int64_t n,
                                           UnaryGradParams p) {
  using V = Bytes16<H>;
  for_vectors<H>(
      n,
      [&](int64_t g) {
        const V xv = reinterpret_cast<const V*>(x)[g];
        const V dv = reinterpret_cast<const V*>(dy)[g];
        V yv;
        if (y != nullptr) yv = reinterpret_cast<const V*>(y)[g];
        V out;
#pragma unroll
        for (int k = 0; k < V::kLanes; ++k)
          out.v[k] = unary_grad16_one<op>(xv.v[k], y != nullptr, y != nullptr ? yv.v[k] : xv.v[k],
                                          dv.v[k], p);
        reinterpret_cast<V*>(dx)[g] = out;
      },
      [&](int64_t i) {
        dx[i] = unary_grad16_one<op>(x[i], y != nullptr, y != nullptr ? y[i] : x[i], dy[i], p);
      });
}

template <UnaryGradOp op>
bool unary_grad16_of(DType dtype, const void* x, const void* y, const void* dy, void* dx,
                     int64_t n, const UnaryGradParams& p, cudaStream_t stream) {
  return visit16(dtype, [&](auto tag) {
    using H = typename decltype(tag)::type;
    if (aligned16(x) && (y == nullptr || aligned16(y)) && aligned16(dy) && aligned16(dx))
      unary_grad16_vector_kernel<op, H>
          <<<grid_for((n + Bytes16<H>::kLanes - 1) / Bytes16<H>::kLanes, kThreads), kThreads, 0,
             stream>>>(static_cast<const H*>(x), static_cast<const H*>(y),
                       static_cast<const H*>(dy), static_cast<H*>(dx), n, p);
    else
      unary_grad16_kernel<op, H><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<const H*>(x), static_cast<const H*>(y), static_cast<const H*>(dy),
          static_cast<H*>(dx), n, p);
  });
}

template <BinaryGradOp op>
__device__ __forceinline__ float binary_grad_one(float u, float v, const float* y, int64_t i,
                                                 float d) {
  if constexpr (op == BinaryGradOp::kPass) {
    return d;
  } else if constexpr (op == BinaryGradOp::kNegate) {
    return -d;
  } else if constexpr (op == BinaryGradOp::kMulLhs) {
    return d * v;
  } else if constexpr (op == BinaryGradOp::kMulRhs) {
    return d * u;
  } else if constexpr (op == BinaryGradOp::kDivLhs) {
    return d / v;
  } else if constexpr (op == BinaryGradOp::kDivRhs) {
    return -d * u / (v * v);
  } else if constexpr (op == BinaryGradOp::kPowBase) {
    if (v == 0) return 0.0f;
    if (v == 1) return d;
    if (v == 2) return d * 2 * u;
    return d * v * powf(u, v - 1);
  } else if constexpr (op == BinaryGradOp::kPowExp) {
    if (!(u > 0)) return 0.0f;
    return y != nullptr ? d * y[i] * logf(u) : d * powf(u, v) * logf(u);
  } else if constexpr (op == BinaryGradOp::kPReluX) {
    return u > 0 ? d : v * d;
  } else if constexpr (op == BinaryGradOp::kPReluSlope) {
    return u > 0 ? 0.0f : u * d;
  } else {  // kFmodRhs
    return -d * truncf(u / v);
  }
}

template <BinaryGradOp op>
__global__ void binary_grad_kernel(const float* lhs, const float* rhs, const float* y,
                                   const float* dy, float* out, int64_t n, BroadcastMap map) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t at[2];
    broadcast_offsets<2>(map, i, at);
    // Add and Sub read only dY: their operands come bare (grad_reads.h), never loaded.
    constexpr bool kReads = op != BinaryGradOp::kPass && op != BinaryGradOp::kNegate;
    out[i] = binary_grad_one<op>(kReads ? lhs[at[0]] : 0.0f, kReads ? rhs[at[1]] : 0.0f, y, i,
                                 dy[i]);
  }
}

template <BinaryGradOp op>
void binary_grad_of(const float* lhs, const float* rhs, const float* y, const float* dy, float* out,
                    int64_t n, const BroadcastMap& map, cudaStream_t stream) {
  binary_grad_kernel<op>
      <<<grid_for(n, kThreads), kThreads, 0, stream>>>(lhs, rhs, y, dy, out, n, map);
}

__global__ void where_grad_kernel(const uint8_t* c, const float* dy, float* out, int64_t n,
                                  BroadcastMap map, bool take_true) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t at[1];
    broadcast_offsets<1>(map, i, at);
    out[i] = (c[at[0]] != 0) == take_true ? dy[i] : 0.0f;
  }
}

__global__ void tie_count_kernel(const float* x, const float* y, float* ties, int64_t n,
                                 BroadcastMap map, bool accumulate) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t at[1];
    broadcast_offsets<1>(map, i, at);
    ties[i] = (accumulate ? ties[i] : 0.0f) + (x[at[0]] == y[i] ? 1.0f : 0.0f);
  }
}

__global__ void min_max_grad_kernel(const float* x, const float* y, const float* dy,
                                    const float* ties, float* out, int64_t n, BroadcastMap map) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t at[1];
    broadcast_offsets<1>(map, i, at);
    out[i] = x[at[0]] == y[i] ? dy[i] / ties[i] : 0.0f;
  }
}

}  // namespace

void launch_tie_count(const float* x, const float* y, float* ties, int64_t n,
                      const BroadcastMap& map, bool accumulate, cudaStream_t stream) {
  if (n <= 0) return;
  tie_count_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, ties, n, map,
                                                                   accumulate);
}

void launch_min_max_grad(const float* x, const float* y, const float* dy, const float* ties,
                         float* out, int64_t n, const BroadcastMap& map, cudaStream_t stream) {
  if (n <= 0) return;
  min_max_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, dy, ties, out, n,
                                                                      map);
}

void launch_unary_grad(UnaryGradOp op, const float* x, const float* y, const float* dy, float* dx,
                       int64_t n, const UnaryGradParams& params, cudaStream_t stream) {
  if (n <= 0) return;
  switch (op) {
    case UnaryGradOp::kRelu:
      return unary_grad_of<UnaryGradOp::kRelu>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kSigmoid:
      return unary_grad_of<UnaryGradOp::kSigmoid>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kTanh:
      return unary_grad_of<UnaryGradOp::kTanh>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kSqrt:
      return unary_grad_of<UnaryGradOp::kSqrt>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kErf:
      return unary_grad_of<UnaryGradOp::kErf>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kHardSigmoid:
      return unary_grad_of<UnaryGradOp::kHardSigmoid>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kHardSwish:
      return unary_grad_of<UnaryGradOp::kHardSwish>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kClip:
      return unary_grad_of<UnaryGradOp::kClip>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kLeakyRelu:
      return unary_grad_of<UnaryGradOp::kLeakyRelu>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kExp:
      return unary_grad_of<UnaryGradOp::kExp>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kLog:
      return unary_grad_of<UnaryGradOp::kLog>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kReciprocal:
      return unary_grad_of<UnaryGradOp::kReciprocal>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kNeg:
      return unary_grad_of<UnaryGradOp::kNeg>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kAbs:
      return unary_grad_of<UnaryGradOp::kAbs>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kZero:
      return unary_grad_of<UnaryGradOp::kZero>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kElu:
      return unary_grad_of<UnaryGradOp::kElu>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kSelu:
      return unary_grad_of<UnaryGradOp::kSelu>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kSoftplus:
      return unary_grad_of<UnaryGradOp::kSoftplus>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kGelu:
      return unary_grad_of<UnaryGradOp::kGelu>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kGeluTanh:
      return unary_grad_of<UnaryGradOp::kGeluTanh>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kCelu:
      return unary_grad_of<UnaryGradOp::kCelu>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kSin:
      return unary_grad_of<UnaryGradOp::kSin>(x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kCos:
      return unary_grad_of<UnaryGradOp::kCos>(x, y, dy, dx, n, params, stream);
  }
}

bool launch_unary_grad(UnaryGradOp op, DType dtype, const void* x, const void* y, const void* dy,
                       void* dx, int64_t n, const UnaryGradParams& params, cudaStream_t stream) {
  if (n <= 0) return true;
  switch (op) {
    case UnaryGradOp::kRelu:
      return unary_grad16_of<UnaryGradOp::kRelu>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kSigmoid:
      return unary_grad16_of<UnaryGradOp::kSigmoid>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kTanh:
      return unary_grad16_of<UnaryGradOp::kTanh>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kHardSigmoid:
      return unary_grad16_of<UnaryGradOp::kHardSigmoid>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kHardSwish:
      return unary_grad16_of<UnaryGradOp::kHardSwish>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kElu:
      return unary_grad16_of<UnaryGradOp::kElu>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kSelu:
      return unary_grad16_of<UnaryGradOp::kSelu>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kGelu:
      return unary_grad16_of<UnaryGradOp::kGelu>(dtype, x, y, dy, dx, n, params, stream);
    case UnaryGradOp::kGeluTanh:
      return unary_grad16_of<UnaryGradOp::kGeluTanh>(dtype, x, y, dy, dx, n, params, stream);
    default:
      return false;
  }
}

void launch_binary_grad(BinaryGradOp op, const float* lhs, const float* rhs, const float* y,
                        const float* dy, float* out, int64_t n, const BroadcastMap& map,
                        cudaStream_t stream) {
  if (n <= 0) return;
  switch (op) {
    case BinaryGradOp::kPass:
      return binary_grad_of<BinaryGradOp::kPass>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kNegate:
      return binary_grad_of<BinaryGradOp::kNegate>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kMulLhs:
      return binary_grad_of<BinaryGradOp::kMulLhs>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kMulRhs:
      return binary_grad_of<BinaryGradOp::kMulRhs>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kDivLhs:
      return binary_grad_of<BinaryGradOp::kDivLhs>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kDivRhs:
      return binary_grad_of<BinaryGradOp::kDivRhs>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kPowBase:
      return binary_grad_of<BinaryGradOp::kPowBase>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kPowExp:
      return binary_grad_of<BinaryGradOp::kPowExp>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kPReluX:
      return binary_grad_of<BinaryGradOp::kPReluX>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kPReluSlope:
      return binary_grad_of<BinaryGradOp::kPReluSlope>(lhs, rhs, y, dy, out, n, map, stream);
    case BinaryGradOp::kFmodRhs:
      return binary_grad_of<BinaryGradOp::kFmodRhs>(lhs, rhs, y, dy, out, n, map, stream);
  }
}

void launch_where_grad(const uint8_t* condition, const float* dy, float* out, int64_t n,
                       const BroadcastMap& map, bool take_true, cudaStream_t stream) {
  if (n <= 0) return;
  where_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(condition, dy, out, n, map,
                                                                    take_true);
}

}  // namespace stagecraft::rt::cuda
