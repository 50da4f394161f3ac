// The optimizer loops of the CPU backend (cpu_context.h), moved unchanged from
// runtime/optim: scalars come from the optimizer rules, the loops only apply them.
#include <algorithm>
#include <cmath>

#if defined(__SSE__) || defined(__AVX__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "runtime/cpu/cpu_context.h"

namespace stagecraft::rt::cpu {

namespace {

// Loops over at least this many elements use all of the calling thread's OpenMP threads.
constexpr int64_t kParallelElements = int64_t{1} << 15;

// The loops with a square root run block by block: GCC keeps std::sqrt scalar inside a loop
// unless built with -fno-math-errno (it must be able to set errno for a negative argument), so
// each block updates the moments in one vectorised loop, takes the square roots with the SIMD
// instruction (correctly rounded like std::sqrt, so results do not depend on the path) and
// then updates the weights in a second vectorised loop. A block stays in L1.
constexpr int64_t kBlock = 512;

void sqrt_in_place(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
#if defined(__SSE__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#elif defined(__aarch64__)
  for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vsqrtq_f32(vld1q_f32(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

// Calls body(begin, length) for consecutive blocks of [0, n), in parallel on big tensors.
template <class Body>
void for_blocks(int64_t n, Body body) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n >= kParallelElements)
  for (int64_t b = 0; b < blocks; ++b) body(b * kBlock, std::min(kBlock, n - b * kBlock));
}

}  // namespace

void sgd_loop(float* __restrict w, const float* __restrict g, int64_t n, const SgdUpdate& u) {
  const float lr = u.lr, l2 = u.l2;
#pragma omp parallel for simd if (parallel : n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * (g[i] + l2 * w[i]);
}

void momentum_loop(float* __restrict w, const float* __restrict g, float* __restrict v, int64_t n,
                   const MomentumUpdate& p) {
  const float lr = p.lr, l2 = p.l2, alpha = p.alpha, beta = p.beta;
  if (p.nesterov) {
#pragma omp parallel for simd if (parallel : n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const float gr = g[i] + l2 * w[i];
      const float vi = alpha * v[i] + beta * gr;
      v[i] = vi;
      w[i] -= lr * (gr + alpha * vi);
    }
  } else {
#pragma omp parallel for simd if (parallel : n >= kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const float vi = alpha * v[i] + beta * (g[i] + l2 * w[i]);
      v[i] = vi;
      w[i] -= lr * vi;
    }
  }
}

void adam_loop(float* w, const float* g, float* m, float* v, int64_t n, const AdamUpdate& p) {
  const float l2 = p.l2, b1 = p.beta1, b2 = p.beta2, c1 = 1.0f - p.beta1, c2 = 1.0f - p.beta2;
  const float step_size = p.step_size, denom_scale = p.denom_scale, eps = p.eps;
  const float pre = p.pre_scale, post = p.post_scale;
  for_blocks(n, [&](int64_t begin, int64_t len) {
    float* __restrict wb = w + begin;
    const float* __restrict gb = g + begin;
    float* __restrict mb = m + begin;
    float* __restrict vb = v + begin;
    float root[kBlock];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gr = gb[i] + l2 * wb[i];
      const float mi = b1 * mb[i] + c1 * gr;
      const float vi = b2 * vb[i] + c2 * (gr * gr);
      mb[i] = mi;
      vb[i] = vi;
      root[i] = vi;
    }
    sqrt_in_place(root, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      wb[i] = post * (pre * wb[i] - step_size * (mb[i] / (root[i] * denom_scale + eps)));
    }
  });
}

void adagrad_loop(float* w, const float* g, float* h, int64_t n, const AdagradUpdate& u) {
  const float lr = u.lr, l2 = u.l2, eps = u.eps;
  for_blocks(n, [&](int64_t begin, int64_t len) {
    float* __restrict wb = w + begin;
    const float* __restrict gb = g + begin;
    float* __restrict hb = h + begin;
    float root[kBlock];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gr = gb[i] + l2 * wb[i];
      const float hi = hb[i] + gr * gr;
      hb[i] = hi;
      root[i] = hi;
    }
    sqrt_in_place(root, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) wb[i] -= lr * ((gb[i] + l2 * wb[i]) / (root[i] + eps));
  });
}

}  // namespace stagecraft::rt::cpu
