#pragma once
/// \file
/// What the CPU kernels' own loops need to run on the vector units.
///
/// STAGECRAFT_CPU_CLONES: the build targets plain x86-64 (SSE2, so it runs on any x86-64
/// machine), so a loop the compiler vectorises gets 4 floats a step, where the machines this
/// runs on mostly have AVX2 (8) or AVX-512 (16). A function marked with it is compiled three
/// times (x86-64-v4: AVX-512; x86-64-v3: AVX2 and FMA; plain) and the loader picks the best the
/// processor has (GCC's target_clones, an ifunc). oneDNN's and BLAS's kernels choose at run
/// time already; this is for ours. A clone with FMA may round a multiply-add once where the
/// plain one rounds twice: runs on one machine give the same bits, machines of different
/// vector units may differ in the last place. Under ThreadSanitizer (tools/test.sh --sanitize
/// thread) the functions are built once, plain.
///
/// select_bits: c ? a : b by bit operations: GCC at -O2 turns a chain of float `?:` into
/// branches, which keeps a loop from vectorising.
///
/// exp_simd: e^x for float32 as straight-line code that a `#pragma omp simd` loop vectorises:
/// glibc's expf is a call per element (no vector variant without -ffast-math), which made the
/// exponentials of the CPU's attention most of its time. Method (Cephes' expf): n =
/// round(x log2 e), r = x - n ln 2 in two parts (Cody and Waite), e^r by a degree-6 polynomial
/// on [-ln 2 / 2, ln 2 / 2], times 2^n built in the exponent bits. Within 1 unit in the last
/// place of e^x rounded to float over [-87.33, 88.72] (every float there checked against
/// glibc's double exp once; tests/runtime/vectorise_test.cpp samples every 1021st); below it
/// (where e^x leaves the normal floats) and at -inf it gives 0, above it +inf; NaN gives NaN.

#include <bit>
#include <cstdint>

// Not under ThreadSanitizer: the loader runs a clone's resolver before TSan's runtime is up,
// and the instrumented resolver crashes (checked with GCC 12: a segmentation fault at start).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define STAGECRAFT_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define STAGECRAFT_CPU_CLONES
#endif

namespace stagecraft::rt::cpu {

inline float select_bits(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

inline float exp_simd(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi exact in 9 bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kLow = -87.33654475f;  // ln of the smallest normal float
  constexpr float kHigh = 88.72283905f;  // ln of the largest float
  // Clamped into range first (a NaN passes both comparisons unchanged). Below the range the
  // polynomial runs on -80 instead of kLow, whose e^x rounds to a subnormal float: arithmetic on
  // subnormals is a microcode assist (~100 cycles), and a causal attention's masked scores
  // (-inf, a quarter of them) all came here.
  const bool low = x<kLow, high = x> kHigh;
  const float xc = select_bits(low, -80.0f, select_bits(high, kHigh, x));
  const float rounded = (xc * kLog2e + kRound) - kRound;
  const float n = select_bits(rounded == rounded, rounded, 0.0f);  // NaN: any n (gives NaN)
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  // 2^n for n in [-126, 128]: at n = 128 (x near kHigh) as 2 * 2^127, which stays finite.
  const int32_t k = static_cast<int32_t>(n);
  const int32_t half = k >> 1;
  const float scale_a = std::bit_cast<float>((half + 127) << 23);
  const float scale_b = std::bit_cast<float>((k - half + 127) << 23);
  const float y = er * scale_a * scale_b;
  return select_bits(low, 0.0f, select_bits(high, __builtin_inff(), y));
}

/// The mean and biased variance of x[0, n), in double: two passes, each sum in a loop built per
/// vector unit (instance_norm.cpp; InstanceNormalization's planes and LayerNormalizationGrad's
/// rows).
void mean_and_variance(const float* x, int64_t n, double& mean, double& var);

}  // namespace stagecraft::rt::cpu
