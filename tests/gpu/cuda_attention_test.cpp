// The CUDA attention kernels (runtime/cuda/attention.cpp) against the CPU backend's on the same
// random float32 operands: O, lse, and dQ, dK, dV (with lse passed and recomputed, dO and dlse
// given), unmasked, causal and masked, Tq = Tk and not; a learned mask's gradient; and on 16-bit
// activations (a mixed plan's) against the CPU's float32 kernels on the same 16-bit values. Label
// "gpu": without a usable GPU the binary exits 77 (gpu_main.cpp) and ctest reports it skipped.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cpu/eltwise_common.h"
#include "tests/runtime/attention_util.h"

namespace stagecraft::testing {
namespace {

using attention::Options;
using attention::random;
using rt::Shape;
using rt::Tensor;

struct Case {
  Shape q;
  int64_t tk = 0, dv = 0;
  Shape mask = {};  // empty: none
  Options options;
  bool hide_first_row = false;  // the mask's first row all -inf: a query that sees no key
};

// The shapes of a case's K, V, O and lse.
struct Shapes {
  Shape k, v, o, lse;
};
Shapes shapes_of(const Case& c) {
  Shapes s{c.q, c.q, c.q, Shape(c.q.begin(), c.q.end() - 1)};
  s.k[s.k.size() - 2] = c.tk;
  s.v[s.v.size() - 2] = c.tk;
  s.v.back() = c.dv;
  s.o.back() = c.dv;
  return s;
}

// Forward then gradient on `backend`: O, lse, then dQ, dK, dV with lse passed, then again
// with lse recomputed.
std::vector<Tensor> run_case(const rt::Backend& backend, const Case& c) {
  const auto [k, v, o, lse_shape] = shapes_of(c);
  const Tensor tq = random(c.q, 1), tk = random(k, 2), tv = random(v, 3);
  std::optional<Tensor> mask;
  if (!c.mask.empty()) {
    mask = random(c.mask, 4, -2, 2);
    mask->as<float>()[0] = -INFINITY;
    if (c.hide_first_row)
      for (int64_t j = 0; j < c.mask.back(); ++j) mask->as<float>()[j] = -INFINITY;
  }
  const Tensor* pmask = mask ? &*mask : nullptr;
  std::vector<Tensor> r = {Tensor::owned(DType::kFloat32, o),
                           Tensor::owned(DType::kFloat32, lse_shape)};
  attention::run(backend, attention::node(c.options), {&tq, &tk, &tv, pmask}, {&r[0], &r[1]});
  const Tensor d_o = random(o, 5), dlse = random(lse_shape, 6);
  const Tensor o_given = r[0], lse_given = r[1];  // views of r's tensors, which r may move
  for (const Tensor* lse : {&lse_given, static_cast<const Tensor*>(nullptr)}) {
    Tensor dq = Tensor::owned(DType::kFloat32, c.q), dk = Tensor::owned(DType::kFloat32, k),
           dv = Tensor::owned(DType::kFloat32, v);
    attention::run(backend, attention::node(c.options, true),
                   {&tq, &tk, &tv, pmask, &o_given, lse, &d_o, &dlse}, {&dq, &dk, &dv, nullptr});
    r.push_back(std::move(dq));
    r.push_back(std::move(dk));
    r.push_back(std::move(dv));
  }
  return r;
}

TEST_CASE("cuda Attention and AttentionGrad match the cpu's") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const Case cases[] = {
      {{2, 2, 70, 64}, 70, 64, {}, {}},
      {{2, 2, 70, 64}, 70, 64, {}, {.causal = true}},
      {{2, 2, 70, 80}, 70, 48, {70, 70}, {.scale = 0.2f}},
      {{2, 2, 70, 32}, 70, 32, {2, 1, 1, 70}, {.causal = true}},
      {{2, 2, 5, 128}, 130, 128, {5, 130}, {}},
      {{3, 130, 32}, 5, 16, {}, {.causal = true}},
      // The tiled kernels (attention_tiled.cu: heads of 32, 64, 128) over several tiles:
      // causal across 4 query and key tiles, Tq > Tk with a mask, a query that sees no key.
      {{1, 3, 200, 64}, 200, 64, {}, {.causal = true}},
      {{2, 130, 128}, 70, 128, {130, 70}, {.causal = true}},
      {{2, 2, 96, 32}, 150, 32, {96, 150}, {.scale = 0.3f}, true},
      {{1, 2, 64, 64}, 64, 64, {64, 64}, {}, true},
  };
  const char* names[] = {"O",
                         "lse",
                         "dQ",
                         "dK",
                         "dV",
                         "dQ (lse recomputed)",
                         "dK (lse recomputed)",
                         "dV (lse recomputed)"};
  for (const Case& c : cases) {
    CAPTURE(rt::shape_string(c.q));
    CAPTURE(c.tk);
    CAPTURE(rt::shape_string(c.mask));
    CAPTURE(c.options.causal);
    const std::vector<Tensor> want = run_case(rt::cpu_backend(), c);
    const std::vector<Tensor> got = run_case(*cuda, c);
    REQUIRE(got.size() == want.size());
    for (size_t k = 0; k < got.size(); ++k)
      attention::check_close(got[k], attention::values(want[k]), 1e-4, names[k]);
  }
}

// A learned mask (a position bias, mask_gradient = 1): dmask, dS summed where the mask
// broadcasts (one warp per mask element on CUDA, attention_kernels.cu), and dQ beside it, against
// the CPU's.
TEST_CASE("cuda AttentionGrad gives a learned mask the cpu's gradient") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const attention::LearnedMaskCase cases[] = {
      {{2, 3, 70, 64}, 70, {1, 3, 70, 70}, {}},
      {{2, 3, 70, 64}, 70, {1, 3, 70, 70}, {.causal = true}},
      {{2, 2, 40, 32}, 90, {40, 1}, {}},
      {{2, 2, 9, 32}, 140, {2, 1, 1, 140}, {.scale = 0.3f}},
  };
  for (const attention::LearnedMaskCase& c : cases) {
    CAPTURE(rt::shape_string(c.q));
    CAPTURE(rt::shape_string(c.mask));
    CAPTURE(c.options.causal);
    const auto [k, v, o, lse_shape] = shapes_of({c.q, c.tk, c.q.back(), {}, {}, false});
    const Tensor tq = random(c.q, 11), tk = random(k, 12), tv = random(v, 13),
                 mask = random(c.mask, 14), d_o = random(o, 15), dlse = random(lse_shape, 16);
    auto run_on = [&](const rt::Backend& backend) {
      Tensor out = Tensor::owned(DType::kFloat32, o),
             lse = Tensor::owned(DType::kFloat32, lse_shape);
      attention::run(backend, attention::node(c.options), {&tq, &tk, &tv, &mask}, {&out, &lse});
      std::vector<Tensor> r = {Tensor::owned(DType::kFloat32, c.q),
                               Tensor::owned(DType::kFloat32, c.mask)};
      attention::run(backend, attention::node(c.options, true),
                     {&tq, &tk, &tv, &mask, &out, &lse, &d_o, &dlse},
                     {&r[0], nullptr, nullptr, &r[1]});
      return r;
    };
    const std::vector<Tensor> want = run_on(rt::cpu_backend());
    const std::vector<Tensor> got = run_on(*cuda);
    attention::check_close(got[0], attention::values(want[0]), 1e-4, "dQ");
    attention::check_close(got[1], attention::values(want[1]), 1e-4, "dmask");
  }
}

// `t` (float32) rounded to `dtype` (bfloat16 or float16), as the CPU's Cast rounds.
Tensor narrowed(const Tensor& t, DType dtype) {
  Tensor out = Tensor::owned(dtype, t.shape);
  auto* bits = reinterpret_cast<uint16_t*>(out.data);
  for (int64_t i = 0; i < t.numel(); ++i)
    bits[i] = dtype == DType::kBFloat16 ? rt::cpu::eltwise::to_bfloat16(t.as<float>()[i]).bits
                                        : rt::cpu::eltwise::to_half(t.as<float>()[i]).bits;
  return out;
}

// A 16-bit tensor's values as float32, exactly.
Tensor widened(const Tensor& t) {
  Tensor out = Tensor::owned(DType::kFloat32, t.shape);
  const auto* bits = reinterpret_cast<const uint16_t*>(t.data);
  for (int64_t i = 0; i < t.numel(); ++i)
    out.as<float>()[i] = t.dtype == DType::kBFloat16
                             ? rt::cpu::eltwise::to_float(rt::cpu::eltwise::BFloat16{bits[i]})
                             : rt::cpu::eltwise::to_float(rt::cpu::eltwise::Half{bits[i]});
  return out;
}

// A mixed-precision plan's Attention: Q, K, V, O, dO and the gradients 16-bit, the mask, lse and
// dlse float32. CUDA runs it natively (the tiled kernels widen each element as they load it, and
// round each output once; attention_tiled.h) or, for heads the tiles do not take, widened
// between Casts; the CPU's float32 kernels on the same 16-bit values, their outputs rounded
// once, are the reference: the two differ by float32 rounding and then one 16-bit rounding
// (on the tensor-core kernels, the default unless STAGECRAFT_ATTENTION_KERNELS names tiled,
// tensor-core or plain, they round P and dS to 16 bits too).
TEST_CASE("cuda Attention and AttentionGrad on 16-bit activations match the cpu's") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const Case cases[] = {
      {{2, 2, 70, 64}, 70, 64, {}, {.causal = true}},
      {{1, 3, 200, 64}, 200, 64, {}, {.causal = true}},
      {{2, 130, 128}, 70, 128, {130, 70}, {.causal = true}},
      {{2, 2, 96, 32}, 150, 32, {96, 150}, {.scale = 0.3f}, true},
      {{2, 2, 70, 80}, 70, 48, {70, 70}, {.scale = 0.2f}},  // not tiled: run widened
  };
  // The tensor-core kernels also round P and dS to 16 bits before they multiply: a few more
  // of those roundings' worth (FlashAttention's own tests allow 1e-2 and more in bfloat16).
  const char* chosen = std::getenv("STAGECRAFT_ATTENTION_KERNELS");
  const std::string named = chosen != nullptr ? chosen : "";
  const bool mma = named != "tiled" && named != "tensor-core" && named != "plain";
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    // One rounding of an output in [-scale, scale] is at most 2^-9 (bfloat16) or 2^-12 (float16)
    // of the scale; the float32 sums before it differ by far less.
    const double rtol = dtype == DType::kBFloat16 ? (mma ? 2e-2 : 8e-3) : (mma ? 4e-3 : 1e-3);
    for (const Case& c : cases) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(rt::shape_string(c.q));
      CAPTURE(c.tk);
      const auto [k, v, o, lse_shape] = shapes_of(c);
      const Tensor q16 = narrowed(random(c.q, 1), dtype), k16 = narrowed(random(k, 2), dtype),
                   v16 = narrowed(random(v, 3), dtype), d_o16 = narrowed(random(o, 5), dtype);
      const Tensor qf = widened(q16), kf = widened(k16), vf = widened(v16), d_of = widened(d_o16);
      std::optional<Tensor> mask;
      if (!c.mask.empty()) {
        mask = random(c.mask, 4, -2, 2);
        if (c.hide_first_row)
          for (int64_t j = 0; j < c.mask.back(); ++j) mask->as<float>()[j] = -INFINITY;
      }
      const Tensor* pmask = mask ? &*mask : nullptr;
      const Tensor dlse = random(lse_shape, 6);
      Tensor o_cpu = Tensor::owned(DType::kFloat32, o),
             lse_cpu = Tensor::owned(DType::kFloat32, lse_shape);
      attention::run(rt::cpu_backend(), attention::node(c.options), {&qf, &kf, &vf, pmask},
                     {&o_cpu, &lse_cpu});
      Tensor o_gpu = Tensor::owned(dtype, o), lse_gpu = Tensor::owned(DType::kFloat32, lse_shape);
      attention::run(*cuda, attention::node(c.options), {&q16, &k16, &v16, pmask},
                     {&o_gpu, &lse_gpu});
      attention::check_close(widened(o_gpu), attention::values(widened(narrowed(o_cpu, dtype))),
                             rtol, "O");
      attention::check_close(lse_gpu, attention::values(lse_cpu), 1e-5, "lse");
      // The gradient from the same O (CUDA's, 16-bit) and lse on both sides; lse given, then
      // recomputed.
      const Tensor o_given = widened(o_gpu);
      for (const Tensor* lse :
           {static_cast<const Tensor*>(&lse_cpu), static_cast<const Tensor*>(nullptr)}) {
        CAPTURE(lse != nullptr);
        Tensor dq = Tensor::owned(DType::kFloat32, c.q), dk = Tensor::owned(DType::kFloat32, k),
               dv = Tensor::owned(DType::kFloat32, v);
        attention::run(rt::cpu_backend(), attention::node(c.options, true),
                       {&qf, &kf, &vf, pmask, &o_given, lse, &d_of, &dlse},
                       {&dq, &dk, &dv, nullptr});
        Tensor dq16 = Tensor::owned(dtype, c.q), dk16 = Tensor::owned(dtype, k),
               dv16 = Tensor::owned(dtype, v);
        attention::run(*cuda, attention::node(c.options, true),
                       {&q16, &k16, &v16, pmask, &o_gpu, lse, &d_o16, &dlse},
                       {&dq16, &dk16, &dv16, nullptr});
        attention::check_close(widened(dq16), attention::values(widened(narrowed(dq, dtype))), rtol,
                               "dQ");
        attention::check_close(widened(dk16), attention::values(widened(narrowed(dk, dtype))), rtol,
                               "dK");
        attention::check_close(widened(dv16), attention::values(widened(narrowed(dv, dtype))), rtol,
                               "dV");
      }
    }
  }
}

}  // namespace
}  // namespace stagecraft::testing
