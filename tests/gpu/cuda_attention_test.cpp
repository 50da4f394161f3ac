// The CUDA attention kernels (runtime/cuda/attention.cpp) against the CPU backend's on the same
// random float32 operands: O, lse, and dQ, dK, dV (with lse passed and recomputed, dO and dlse
// given), unmasked, causal and masked, Tq = Tk and not. Label "gpu": without a usable GPU the
// binary exits 77 (gpu_main.cpp) and ctest reports it skipped.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "runtime/core/backend.h"
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

// Forward then gradient on `backend`: O, lse, then dQ, dK, dV with lse passed, then again
// with lse recomputed.
std::vector<Tensor> run_case(const rt::Backend& backend, const Case& c) {
  Shape k = c.q, v = c.q, o = c.q;
  k[k.size() - 2] = c.tk;
  v[v.size() - 2] = c.tk;
  v.back() = c.dv;
  o.back() = c.dv;
  const Shape lse_shape(c.q.begin(), c.q.end() - 1);
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

}  // namespace
}  // namespace stagecraft::testing
