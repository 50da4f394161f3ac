// Finite-difference checks of the fused attention gradient (runtime/cpu/attention.cpp): dQ, dK
// and dV of Attention (domain ai.stagecraft) with and without causal and an additive mask, the
// loss over O alone and over O and lse (so dlse reaches the inputs too).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/format/grad_ops.h"
#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

struct AttentionCase {
  Shape q = {};  // [..., Tq, d]
  int64_t tk = 0, dv = 0;
  bool causal = false;
  Shape mask = {};  // empty: none
  int outputs = 1;
  float scale = 0.0f;  // 0: the default 1/sqrt(d)
};

void attention(const AttentionCase& a) {
  CAPTURE(rt::shape_string(a.q));
  CAPTURE(a.tk);
  CAPTURE(a.causal);
  CAPTURE(rt::shape_string(a.mask));
  CAPTURE(a.outputs);
  Shape k = a.q, v = a.q, o = a.q;
  k[k.size() - 2] = a.tk;
  v[v.size() - 2] = a.tk;
  v.back() = a.dv;
  o.back() = a.dv;
  GradCase g;
  g.op = "Attention";
  g.domain = std::string(grad::kGradDomain);
  g.inputs = {random_tensor(a.q, -1, 1, 1), random_tensor(k, -1, 1, 2), random_tensor(v, -1, 1, 3)};
  g.check = {true, true, true};
  if (!a.mask.empty()) {
    Tensor mask = random_tensor(a.mask, -1, 1, 4);
    mask.as<float>()[1] = -INFINITY;  // one hidden key (every query keeps others)
    g.inputs.push_back(std::move(mask));
    g.check.push_back(false);  // the mask takes no gradient
  }
  g.outputs = a.outputs;
  g.output_shapes = {o, Shape(a.q.begin(), a.q.end() - 1)};
  g.output_shapes.resize(static_cast<size_t>(a.outputs));
  g.attrs = [=](onnx::NodeProto& n) {
    if (a.causal) set_int(n, "causal", 1);
    if (a.scale != 0.0f) set_float(n, "scale", a.scale);
  };
  gradcheck(g);
}

}  // namespace

TEST_CASE("grad Attention") {
  attention({.q = {2, 5, 4}, .tk = 6, .dv = 3});
  attention({.q = {2, 5, 4}, .tk = 6, .dv = 3, .causal = true, .outputs = 2});
  attention({.q = {2, 2, 5, 4}, .tk = 5, .dv = 3, .causal = true, .mask = {5, 5}, .outputs = 2});
  attention({.q = {2, 2, 4, 3}, .tk = 7, .dv = 2, .mask = {2, 1, 1, 7}, .scale = 0.7f});
  attention({.q = {1, 3, 7, 4}, .tk = 3, .dv = 4, .causal = true, .mask = {3, 1, 3}, .outputs = 2});
}

}  // namespace stagecraft::testing
