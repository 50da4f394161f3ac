// The CUDA elementwise family's device kernels (elementwise_kernels.h): one generic unary, one
// generic broadcasting binary and one Where kernel, each a grid-stride loop with int64 indices,
// templated on the element types and on a functor that computes one element exactly as the CPU
// backend's elementwise.cpp does (integer arithmetic wrapping, saturating float-to-integer
// conversions, 16-bit floats rounded to nearest even through the same bit arithmetic).
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "runtime/cuda/elementwise_device.cuh"
#include "runtime/cuda/elementwise_kernels.h"
#include "runtime/cuda/update_kernels.h"
#include "runtime/ops/compare_element.h"
#include "runtime/ops/dropout_mask.h"
#include "runtime/ops/gelu_element.h"
#include "runtime/ops/pow_element.h"

namespace stagecraft::rt::cuda {
namespace {

using namespace eltwise;

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------------------------
// Unary ops

template <UnaryOp op, class T>
constexpr bool kUnarySupported = op == UnaryOp::kClip || op == UnaryOp::kAbs
                                     ? std::is_arithmetic_v<T>
                                     : (op == UnaryOp::kRelu || op == UnaryOp::kNeg
                                            ? std::is_floating_point_v<T> || std::is_signed_v<T>
                                            : std::is_floating_point_v<T>);

// -x; integers in their unsigned type, so the lowest value wraps to itself (as the CPU's).
template <class T>
__device__ __forceinline__ T negate(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return -v;
  else
    return static_cast<T>(Wrap<T>(0) - Wrap<T>(v));
}

// max(0, min(1, alpha * x + beta)), written so that NaN propagates (as the CPU's).
template <class T>
__device__ __forceinline__ T hard_sigmoid(T x, T alpha, T beta) {
  T v = alpha * x + beta;
  v = v < T(0) ? T(0) : v;
  return v > T(1) ? T(1) : v;
}

template <UnaryOp op, class T>
__device__ __forceinline__ T unary_one(T v, const UnaryParams& p, T lo, T hi) {
  constexpr bool f32 = std::is_same_v<T, float>;
  if constexpr (op == UnaryOp::kRelu) {
    return v < T(0) ? T(0) : v;
  } else if constexpr (op == UnaryOp::kSigmoid) {
    if constexpr (f32)
      return 1.0f / (1.0f + expf(-v));
    else
      return 1 / (1 + exp(-v));
  } else if constexpr (op == UnaryOp::kTanh) {
    if constexpr (f32)
      return tanhf(v);
    else
      return tanh(v);
  } else if constexpr (op == UnaryOp::kSqrt) {
    if constexpr (f32)
      return sqrtf(v);
    else
      return sqrt(v);
  } else if constexpr (op == UnaryOp::kErf) {
    if constexpr (f32)
      return erff(v);
    else
      return erf(v);
  } else if constexpr (op == UnaryOp::kHardSigmoid) {
    return hard_sigmoid<T>(v, static_cast<T>(p.alpha), static_cast<T>(p.beta));
  } else if constexpr (op == UnaryOp::kHardSwish) {
    return v * hard_sigmoid<T>(v, T(1) / T(6), T(0.5));
  } else if constexpr (op == UnaryOp::kLeakyRelu) {
    return v < T(0) ? static_cast<T>(p.alpha) * v : v;
  } else if constexpr (op == UnaryOp::kExp) {
    if constexpr (f32)
      return expf(v);
    else
      return exp(v);
  } else if constexpr (op == UnaryOp::kReciprocal) {
    return T(1) / v;
  } else if constexpr (op == UnaryOp::kLog) {
    if constexpr (f32)
      return logf(v);
    else
      return log(v);
  } else if constexpr (op == UnaryOp::kNeg) {
    return negate(v);
  } else if constexpr (op == UnaryOp::kAbs) {
    if constexpr (std::is_floating_point_v<T>)
      return fabs(v);
    else if constexpr (std::is_unsigned_v<T>)
      return v;
    else
      return v < T(0) ? negate(v) : v;
  } else if constexpr (op == UnaryOp::kCeil) {
    return ceil(v);
  } else if constexpr (op == UnaryOp::kFloor) {
    return floor(v);
  } else if constexpr (op == UnaryOp::kElu) {
    return v > T(0) ? v : static_cast<T>(p.alpha) * expm1(v);
  } else if constexpr (op == UnaryOp::kSelu) {
    return static_cast<T>(p.gamma) * (v > T(0) ? v : static_cast<T>(p.alpha) * expm1(v));
  } else if constexpr (op == UnaryOp::kSoftplus) {
    // log(1 + e^x) without overflow for a large x or rounding to 0 for a very negative one.
    return v > T(0) ? v + log1p(exp(-v)) : log1p(exp(v));
  } else if constexpr (op == UnaryOp::kGelu) {
    return ops::gelu<T>(v);
  } else if constexpr (op == UnaryOp::kGeluTanh) {
    return ops::gelu_tanh<T>(v);
  } else if constexpr (op == UnaryOp::kCelu) {
    return v > T(0) ? v : static_cast<T>(p.alpha) * expm1(v / static_cast<T>(p.alpha));
  } else if constexpr (op == UnaryOp::kSin) {
    if constexpr (f32)
      return sinf(v);
    else
      return sin(v);
  } else if constexpr (op == UnaryOp::kCos) {
    if constexpr (f32)
      return cosf(v);
    else
      return cos(v);
  } else if constexpr (op == UnaryOp::kSign) {
    return v > T(0) ? T(1) : (v < T(0) ? T(-1) : v * T(0));
  } else if constexpr (op == UnaryOp::kRound) {
    return rint(v);
  } else {  // Clip: min(max(x, lo), hi), NaN stays NaN and lo > hi gives hi, as numpy.clip
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
  }
}

template <UnaryOp op, class T>
__global__ void unary_kernel(const T* x, T* y, int64_t n, UnaryParams p) {
  T lo = Limits<T>::lowest(), hi = Limits<T>::max();
  if constexpr (op == UnaryOp::kClip) {
    if (p.lo_attr)
      lo = convert<T>(p.lo);
    else if (p.lo_ptr != nullptr)
      lo = *static_cast<const T*>(p.lo_ptr);
    if (p.hi_attr)
      hi = convert<T>(p.hi);
    else if (p.hi_ptr != nullptr)
      hi = *static_cast<const T*>(p.hi_ptr);
  }
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = unary_one<op, T>(x[i], p, lo, hi);
}

// A unary op on 16-bit floats: each element widened exactly, the float32 formula, the result
// rounded to nearest even: the widened fallback's bits (run_widened) without its two casts
// through memory. Not Clip, whose bounds may be tensors of the input's type.
template <UnaryOp op, class H>
__device__ __forceinline__ H unary16_one(H x, const UnaryParams& p) {
  return convert<H>(
      unary_one<op, float>(to_float(x), p, Limits<float>::lowest(), Limits<float>::max()));
}

template <UnaryOp op, class H>
__global__ void unary16_kernel(const H* x, H* y, int64_t n, UnaryParams p) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = unary16_one<op>(x[i], p);
}

// unary16_kernel 16 bytes (8 elements) a thread, x and y 16-byte aligned: the same bits. (One
// element a thread moved GPT-2's Gelu at 0.9 TB/s and ResNet-50's ReLU at 1.0 on an H200.)
template <UnaryOp op, class H>
__global__ void unary16_vector_kernel(const H* x, H* y, int64_t n, UnaryParams p) {
  using V = Bytes16<H>;
  for_vectors<H>(
      n,
      [&](int64_t g) {
        const V a = reinterpret_cast<const V*>(x)[g];
        V b;
#pragma unroll
        for (int k = 0; k < V::kLanes; ++k) b.v[k] = unary16_one<op>(a.v[k], p);
        reinterpret_cast<V*>(y)[g] = b;
      },
      [&](int64_t i) { y[i] = unary16_one<op>(x[i], p); });
}

template <UnaryOp op>
bool unary_of(DType dtype, const void* x, void* y, int64_t n, const UnaryParams& p,
              cudaStream_t stream) {
  if constexpr (op != UnaryOp::kClip && kUnarySupported<op, float>) {
    const bool half = visit16(dtype, [&](auto tag) {
      using H = typename decltype(tag)::type;
      if (aligned16(x) && aligned16(y))
        unary16_vector_kernel<op, H>
            <<<grid_for((n + Bytes16<H>::kLanes - 1) / Bytes16<H>::kLanes, kThreads), kThreads, 0,
               stream>>>(static_cast<const H*>(x), static_cast<H*>(y), n, p);
      else
        unary16_kernel<op, H><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
            static_cast<const H*>(x), static_cast<H*>(y), n, p);
    });
    if (half) return true;
  }
  bool launched = false;
  visit<false>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kUnarySupported<op, T>) {
      unary_kernel<op, T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                          static_cast<T*>(y), n, p);
      launched = true;
    }
  });
  return launched;
}

template <class To, class From>
__global__ void cast_kernel(const From* x, To* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = convert<To>(x[i]);
}

// Casts between float32 and a 16-bit float (the widening and narrowing a 16-bit plan runs
// around every node without a 16-bit kernel), 8 elements a thread through 16-byte accesses:
// x and y 16-byte aligned. The same conversion as cast_kernel, element for element.
constexpr int kCastVector = 8;

template <class T>
struct alignas(16) CastGroup {
  T v[kCastVector];
};

template <class To, class From>
__global__ void cast_vector_kernel(const From* x, To* y, int64_t n) {
  const int64_t groups = n / kCastVector;
  const auto* in = reinterpret_cast<const CastGroup<From>*>(x);
  auto* out = reinterpret_cast<CastGroup<To>*>(y);
  for (int64_t g = first_index(); g < groups; g += grid_stride()) {
    const CastGroup<From> a = in[g];
    CastGroup<To> b;
#pragma unroll
    for (int k = 0; k < kCastVector; ++k) b.v[k] = convert<To>(a.v[k]);
    out[g] = b;
  }
  for (int64_t i = groups * kCastVector + first_index(); i < n; i += grid_stride())
    y[i] = convert<To>(x[i]);
}

// The vector cast where `from` -> `to` is float32 to or from a 16-bit float and both pointers
// allow it; false (nothing launched) otherwise.
template <class Half16>
bool cast_vector_of(DType from, DType to, DType half, const void* x, void* y, int64_t n,
                    cudaStream_t stream) {
  const unsigned blocks = grid_for((n + kCastVector - 1) / kCastVector, kThreads);
  if (from == DType::kFloat32 && to == half) {
    cast_vector_kernel<Half16, float>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(x), static_cast<Half16*>(y), n);
    return true;
  }
  if (from == half && to == DType::kFloat32) {
    cast_vector_kernel<float, Half16>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const Half16*>(x), static_cast<float*>(y), n);
    return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Binary ops with broadcasting

template <class A, class B, class Out, class F>
__global__ void binary_kernel(const A* x, const B* y, Out* z, int64_t n, BroadcastMap map, F f) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t at[2];
    broadcast_offsets<2>(map, i, at);
    z[i] = f(x[at[0]], y[at[1]]);
  }
}

// A binary op whose operands are each read straight along the output or repeat one row of it
// (a transformer's residual Adds; its bias Adds, the bias repeated over every row): 16 bytes of
// each operand a thread (8 16-bit floats, 4 float32) rather than one element, x, y and z
// 16-byte aligned and a repeated row a whole number of groups. `x_row`, `y_row`: 0 for an
// operand read straight, else the groups of the row it repeats. The same functor as
// binary_kernel, element for element.
template <class T, class F>
__global__ void vector_binary_kernel(const T* x, const T* y, T* z, int64_t n, int64_t x_row,
                                     int64_t y_row, F f) {
  using Group = Bytes16<T>;
  constexpr int kLanes = Group::kLanes;
  const int64_t groups = n / kLanes;
  const auto* xs = reinterpret_cast<const Group*>(x);
  const auto* ys = reinterpret_cast<const Group*>(y);
  auto* zs = reinterpret_cast<Group*>(z);
  for (int64_t g = first_index(); g < groups; g += grid_stride()) {
    const Group a = xs[x_row ? g % x_row : g], b = ys[y_row ? g % y_row : g];
    Group c;
#pragma unroll
    for (int k = 0; k < kLanes; ++k) c.v[k] = f(a.v[k], b.v[k]);
    zs[g] = c;
  }
  // The last partial group (operands read straight: a repeated row is whole groups, so n is).
  for (int64_t i = groups * kLanes + first_index(); i < n; i += grid_stride()) z[i] = f(x[i], y[i]);
}

// How vector_binary_kernel reads the operands of `map` with `lanes` elements a group: each
// straight (0) or repeating a row (its groups); nothing where the map is neither (a broadcast
// inside a row, over a middle dim, a scalar) or a pointer is not 16-byte aligned.
std::optional<std::pair<int64_t, int64_t>> vector_rows(const BroadcastMap& map, int lanes,
                                                       const void* x, const void* y,
                                                       const void* z) {
  if (!aligned16(x) || !aligned16(y) || !aligned16(z)) return std::nullopt;
  if (map.rank == 1) {
    if (map.strides[0][0] == 1 && map.strides[1][0] == 1) return std::pair<int64_t, int64_t>{0, 0};
    return std::nullopt;
  }
  if (map.rank != 2 || map.dims[1] % lanes != 0) return std::nullopt;
  const int64_t row = map.dims[1];
  auto read = [&](int k) -> std::optional<int64_t> {
    if (map.strides[k][1] != 1) return std::nullopt;
    if (map.strides[k][0] == row) return int64_t{0};
    if (map.strides[k][0] == 0) return row / lanes;
    return std::nullopt;
  };
  const auto a = read(0), b = read(1);
  if (!a || !b) return std::nullopt;
  return std::pair<int64_t, int64_t>{*a, *b};
}

template <class A, class B, class Out, class F>
void launch_binary_of(const void* x, const void* y, void* z, int64_t n, const BroadcastMap& map,
                      F f, cudaStream_t stream) {
  if constexpr (std::is_same_v<A, B> && std::is_same_v<A, Out> && sizeof(A) <= 4) {
    if (const auto rows = vector_rows(map, Bytes16<A>::kLanes, x, y, z)) {
      const int64_t groups = (n + Bytes16<A>::kLanes - 1) / Bytes16<A>::kLanes;
      vector_binary_kernel<A, F><<<grid_for(groups, kThreads), kThreads, 0, stream>>>(
          static_cast<const A*>(x), static_cast<const A*>(y), static_cast<A*>(z), n, rows->first,
          rows->second, f);
      return;
    }
  }
  binary_kernel<A, B, Out, F><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      static_cast<const A*>(x), static_cast<const B*>(y), static_cast<Out*>(z), n, map, f);
}

// One element of Add, Sub, Mul or Div. Integers wrap; integer Div truncates toward zero and
// x / -1 is the wrapped negation (no INT_MIN / -1 trap); a zero divisor (refused by the host)
// gives 0 rather than undefined behaviour.
template <BinaryOp op, class T>
struct Arith {
  __device__ T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) {
      if constexpr (op == BinaryOp::kAdd)
        return x + y;
      else if constexpr (op == BinaryOp::kSub)
        return x - y;
      else if constexpr (op == BinaryOp::kMul)
        return x * y;
      else
        return x / y;
    } else {
      using U = Wrap<T>;
      if constexpr (op == BinaryOp::kAdd) {
        return static_cast<T>(U(x) + U(y));
      } else if constexpr (op == BinaryOp::kSub) {
        return static_cast<T>(U(x) - U(y));
      } else if constexpr (op == BinaryOp::kMul) {
        return static_cast<T>(U(x) * U(y));
      } else {
        if (y == T(0)) return T(0);
        if constexpr (std::is_signed_v<T>)
          if (y == T(-1)) return static_cast<T>(U(0) - U(x));
        return static_cast<T>(x / y);
      }
    }
  }
};

// One element of Pow: float32 with float32 in single precision, every other float mix in
// double; integer bases with integer exponents exact, with float exponents saturated.
template <class T, class E>
struct Power {
  __device__ T operator()(T x, E e) const {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<E, float>) {
      if (e == 2.0f) return x * x;
      if (e == 3.0f) return x * x * x;
      return powf(x, e);
    } else if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(pow(static_cast<double>(x), static_cast<double>(e)));
    } else if constexpr (std::is_floating_point_v<E>) {
      return convert<T>(pow(static_cast<double>(x), static_cast<double>(e)));
    } else {
      return ops::int_pow(x, e);
    }
  }
};

template <class T>
struct Equal {
  __device__ uint8_t operator()(T x, T y) const {
    if constexpr (std::is_same_v<T, BoolByte>)
      return static_cast<uint8_t>((x.value != 0) == (y.value != 0));
    else
      return static_cast<uint8_t>(x == y);
  }
};

// A float32 binary functor on 16-bit floats: operands widened exactly, the result rounded to
// nearest even (the widened fallback's bits, as unary16_kernel).
template <class H, class F>
struct Widened16 {
  F f;
  __device__ H operator()(H u, H v) const { return convert<H>(f(to_float(u), to_float(v))); }
};

template <BinaryOp op>
bool arith_of(DType dtype, const void* x, const void* y, void* z, int64_t n,
              const BroadcastMap& map, cudaStream_t stream) {
  const bool half = visit16(dtype, [&](auto tag) {
    using H = typename decltype(tag)::type;
    launch_binary_of<H, H, H>(x, y, z, n, map, Widened16<H, Arith<op, float>>{}, stream);
  });
  if (half) return true;
  return visit<false>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_binary_of<T, T, T>(x, y, z, n, map, Arith<op, T>{}, stream);
  });
}

// The larger (kMax) or smaller of u and v; NaN when either is (as the CPU's).
template <bool kMax, class T>
struct MinMax {
  __device__ T operator()(T u, T v) const {
    if constexpr (std::is_floating_point_v<T>)
      if (u != u) return u;
    return (kMax ? u > v : u < v) ? u : v;
  }
};

template <ops::Comparison kWhich, class T>
struct Compare {
  __device__ uint8_t operator()(T u, T v) const {
    return static_cast<uint8_t>(ops::compare<kWhich>(u, v));
  }
};

template <bool kAnd>
struct Logic {
  __device__ uint8_t operator()(uint8_t u, uint8_t v) const {
    return static_cast<uint8_t>(kAnd ? (u != 0) && (v != 0) : (u != 0) || (v != 0));
  }
};

// x mod y as the CPU's: fmod truncated, else floored; the lowest value mod -1 is 0, and a zero
// divisor (refused by the host) gives 0 rather than undefined behaviour.
template <bool kFmod, class T>
struct Mod {
  __device__ T operator()(T x, T y) const {
    if constexpr (std::is_floating_point_v<T>) {
      return fmod(x, y);
    } else {
      if (y == T(0)) return T(0);
      if constexpr (std::is_unsigned_v<T>) {
        return static_cast<T>(x % y);
      } else {
        if (y == T(-1)) return T(0);
        const T r = static_cast<T>(x % y);
        if constexpr (kFmod) return r;
        return r != T(0) && ((r < T(0)) != (y < T(0))) ? static_cast<T>(r + y) : r;
      }
    }
  }
};

// Min, Max, Mod: numeric inputs and output of one type, the functor F<T>.
template <template <class> class F>
bool same_type_of(DType dtype, const void* x, const void* y, void* z, int64_t n,
                  const BroadcastMap& map, cudaStream_t stream) {
  return visit<false>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_binary_of<T, T, T>(x, y, z, n, map, F<T>{}, stream);
  });
}

template <ops::Comparison kWhich>
bool compare_of(DType dtype, const void* x, const void* y, void* z, int64_t n,
                const BroadcastMap& map, cudaStream_t stream) {
  return visit<false>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_binary_of<T, T, uint8_t>(x, y, z, n, map, Compare<kWhich, T>{}, stream);
  });
}

template <bool kAnd>
bool logic_of(DType dtype, const void* x, const void* y, void* z, int64_t n,
              const BroadcastMap& map, cudaStream_t stream) {
  if (dtype != DType::kBool) return false;
  launch_binary_of<uint8_t, uint8_t, uint8_t>(x, y, z, n, map, Logic<kAnd>{}, stream);
  return true;
}

template <class T>
using MinOf = MinMax<false, T>;
template <class T>
using MaxOf = MinMax<true, T>;
template <class T>
using ModOf = Mod<false, T>;
template <class T>
using FmodOf = Mod<true, T>;

__global__ void not_kernel(const uint8_t* x, uint8_t* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[i] == 0 ? 1 : 0;
}

// IsNaN (`nan`) or IsInf (`pos`, `neg`: which infinities count) of each element.
template <class T>
__global__ void special_kernel(const T* x, uint8_t* y, int64_t n, bool nan, bool pos, bool neg) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const T v = x[i];
    y[i] = nan ? (v != v ? 1 : 0)
               : ((pos && isinf(v) && v > T(0)) || (neg && isinf(v) && v < T(0)) ? 1 : 0);
  }
}

template <class T>
struct PRelu {
  __device__ T operator()(T x, T slope) const { return x > T(0) ? x : slope * x; }
};

bool prelu_of(DType dtype, const void* x, const void* y, void* z, int64_t n,
              const BroadcastMap& map, cudaStream_t stream) {
  bool launched = false;
  visit<false>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T>) {
      launch_binary_of<T, T, T>(x, y, z, n, map, PRelu<T>{}, stream);
      launched = true;
    }
  });
  return launched;
}

bool pow_of(DType base, DType exponent, const void* x, const void* y, void* z, int64_t n,
            const BroadcastMap& map, cudaStream_t stream) {
  bool launched = false;
  visit<false>(base, [&](auto base_tag) {
    using T = typename decltype(base_tag)::type;
    constexpr bool base_ok =
        std::is_floating_point_v<T> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
    if constexpr (base_ok)
      launched = visit<false>(exponent, [&](auto exponent_tag) {
        using E = typename decltype(exponent_tag)::type;
        launch_binary_of<T, E, T>(x, y, z, n, map, Power<T, E>{}, stream);
      });
  });
  return launched;
}

bool equal_of(DType dtype, const void* x, const void* y, void* z, int64_t n,
              const BroadcastMap& map, cudaStream_t stream) {
  bool launched = false;
  visit<true>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, BoolByte>) {
      launch_binary_of<T, T, uint8_t>(x, y, z, n, map, Equal<T>{}, stream);
      launched = true;
    }
  });
  return launched;
}

// ---------------------------------------------------------------------------------------------
// Where and fill

template <class W>
__global__ void where_kernel(const uint8_t* c, const W* x, const W* y, W* z, int64_t n,
                             BroadcastMap map) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    int64_t at[3];
    broadcast_offsets<3>(map, i, at);
    z[i] = c[at[0]] ? x[at[1]] : y[at[2]];
  }
}

template <class W>
__global__ void fill_kernel(W* dst, W value, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = value;
}

__global__ void dropout_training_kernel(const float* x, float* y, uint8_t* mask, int64_t n,
                                        uint64_t node_key, float ratio, float scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const bool kept = ops::dropout_keeps(node_key, i, ratio);
    y[i] = kept ? x[i] * scale : 0.0f;
    if (mask != nullptr) mask[i] = kept ? 1 : 0;
  }
}

__global__ void dropout_grad_kernel(const float* dy, const uint8_t* mask, float* dx, int64_t n,
                                    float scale) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = mask[i] != 0 ? dy[i] * scale : 0.0f;
}

}  // namespace

void launch_dropout_training(const float* x, float* y, uint8_t* mask, int64_t n, uint64_t node_key,
                             float ratio, cudaStream_t stream) {
  if (n <= 0) return;
  dropout_training_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      x, y, mask, n, node_key, ratio, 1.0f / (1.0f - ratio));
}

void launch_dropout_grad(const float* dy, const uint8_t* mask, float* dx, int64_t n, float ratio,
                         cudaStream_t stream) {
  if (n <= 0) return;
  dropout_grad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dy, mask, dx, n,
                                                                      1.0f / (1.0f - ratio));
}

bool launch_unary(UnaryOp op, DType dtype, const void* x, void* y, int64_t n,
                  const UnaryParams& params, cudaStream_t stream) {
  if (n <= 0) return true;
  switch (op) {
    case UnaryOp::kRelu:
      return unary_of<UnaryOp::kRelu>(dtype, x, y, n, params, stream);
    case UnaryOp::kSigmoid:
      return unary_of<UnaryOp::kSigmoid>(dtype, x, y, n, params, stream);
    case UnaryOp::kTanh:
      return unary_of<UnaryOp::kTanh>(dtype, x, y, n, params, stream);
    case UnaryOp::kSqrt:
      return unary_of<UnaryOp::kSqrt>(dtype, x, y, n, params, stream);
    case UnaryOp::kErf:
      return unary_of<UnaryOp::kErf>(dtype, x, y, n, params, stream);
    case UnaryOp::kHardSigmoid:
      return unary_of<UnaryOp::kHardSigmoid>(dtype, x, y, n, params, stream);
    case UnaryOp::kHardSwish:
      return unary_of<UnaryOp::kHardSwish>(dtype, x, y, n, params, stream);
    case UnaryOp::kLeakyRelu:
      return unary_of<UnaryOp::kLeakyRelu>(dtype, x, y, n, params, stream);
    case UnaryOp::kClip:
      return unary_of<UnaryOp::kClip>(dtype, x, y, n, params, stream);
    case UnaryOp::kExp:
      return unary_of<UnaryOp::kExp>(dtype, x, y, n, params, stream);
    case UnaryOp::kLog:
      return unary_of<UnaryOp::kLog>(dtype, x, y, n, params, stream);
    case UnaryOp::kReciprocal:
      return unary_of<UnaryOp::kReciprocal>(dtype, x, y, n, params, stream);
    case UnaryOp::kNeg:
      return unary_of<UnaryOp::kNeg>(dtype, x, y, n, params, stream);
    case UnaryOp::kAbs:
      return unary_of<UnaryOp::kAbs>(dtype, x, y, n, params, stream);
    case UnaryOp::kCeil:
      return unary_of<UnaryOp::kCeil>(dtype, x, y, n, params, stream);
    case UnaryOp::kFloor:
      return unary_of<UnaryOp::kFloor>(dtype, x, y, n, params, stream);
    case UnaryOp::kElu:
      return unary_of<UnaryOp::kElu>(dtype, x, y, n, params, stream);
    case UnaryOp::kSelu:
      return unary_of<UnaryOp::kSelu>(dtype, x, y, n, params, stream);
    case UnaryOp::kSoftplus:
      return unary_of<UnaryOp::kSoftplus>(dtype, x, y, n, params, stream);
    case UnaryOp::kGelu:
      return unary_of<UnaryOp::kGelu>(dtype, x, y, n, params, stream);
    case UnaryOp::kGeluTanh:
      return unary_of<UnaryOp::kGeluTanh>(dtype, x, y, n, params, stream);
    case UnaryOp::kCelu:
      return unary_of<UnaryOp::kCelu>(dtype, x, y, n, params, stream);
    case UnaryOp::kSin:
      return unary_of<UnaryOp::kSin>(dtype, x, y, n, params, stream);
    case UnaryOp::kCos:
      return unary_of<UnaryOp::kCos>(dtype, x, y, n, params, stream);
    case UnaryOp::kSign:
      return unary_of<UnaryOp::kSign>(dtype, x, y, n, params, stream);
    case UnaryOp::kRound:
      return unary_of<UnaryOp::kRound>(dtype, x, y, n, params, stream);
  }
  return false;
}

bool launch_cast(DType from, DType to, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return true;
  if (aligned16(x) && aligned16(y) &&
      (cast_vector_of<BFloat16>(from, to, DType::kBFloat16, x, y, n, stream) ||
       cast_vector_of<Half>(from, to, DType::kFloat16, x, y, n, stream)))
    return true;
  bool launched = false;
  visit<true>(from, [&](auto from_tag) {
    using F = typename decltype(from_tag)::type;
    launched = visit<true>(to, [&](auto to_tag) {
      using T = typename decltype(to_tag)::type;
      cast_kernel<T, F><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const F*>(x),
                                                                        static_cast<T*>(y), n);
    });
  });
  return launched;
}

bool launch_binary(BinaryOp op, DType x_dtype, DType y_dtype, const void* x, const void* y, void* z,
                   int64_t n, const BroadcastMap& map, cudaStream_t stream) {
  if (n <= 0) return true;
  switch (op) {
    case BinaryOp::kAdd:
      return arith_of<BinaryOp::kAdd>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kSub:
      return arith_of<BinaryOp::kSub>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kMul:
      return arith_of<BinaryOp::kMul>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kDiv:
      return arith_of<BinaryOp::kDiv>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kPow:
      return pow_of(x_dtype, y_dtype, x, y, z, n, map, stream);
    case BinaryOp::kEqual:
      return equal_of(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kPRelu:
      return prelu_of(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kGreater:
      return compare_of<ops::Comparison::kGreater>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kLess:
      return compare_of<ops::Comparison::kLess>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kGreaterOrEqual:
      return compare_of<ops::Comparison::kGreaterOrEqual>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kLessOrEqual:
      return compare_of<ops::Comparison::kLessOrEqual>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kAnd:
      return logic_of<true>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kOr:
      return logic_of<false>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kMin:
      return same_type_of<MinOf>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kMax:
      return same_type_of<MaxOf>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kMod:
      return same_type_of<ModOf>(x_dtype, x, y, z, n, map, stream);
    case BinaryOp::kFmod:
      return same_type_of<FmodOf>(x_dtype, x, y, z, n, map, stream);
  }
  return false;
}

bool launch_not(const uint8_t* x, uint8_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return true;
  not_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, n);
  return true;
}

bool launch_is_special(DType dtype, const void* x, uint8_t* y, int64_t n, bool nan, bool pos,
                       bool neg, cudaStream_t stream) {
  if (n <= 0) return true;
  if (dtype == DType::kFloat32)
    special_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const float*>(x), y,
                                                                   n, nan, pos, neg);
  else if (dtype == DType::kFloat64)
    special_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const double*>(x), y,
                                                                   n, nan, pos, neg);
  else
    return false;
  return true;
}

bool launch_where(int64_t element_bytes, const uint8_t* condition, const void* x, const void* y,
                  void* z, int64_t n, const BroadcastMap& map, cudaStream_t stream) {
  if (n <= 0) return true;
  return by_size(element_bytes, [&](auto tag) {
    using W = typename decltype(tag)::type;
    where_kernel<W><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        condition, static_cast<const W*>(x), static_cast<const W*>(y), static_cast<W*>(z), n, map);
  });
}

bool launch_fill(void* dst, int64_t element_bytes, uint64_t bits, int64_t n, cudaStream_t stream) {
  if (n <= 0) return true;
  return by_size(element_bytes, [&](auto tag) {
    using W = typename decltype(tag)::type;
    fill_kernel<W><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<W*>(dst),
                                                                   static_cast<W>(bits), n);
  });
}

}  // namespace stagecraft::rt::cuda
