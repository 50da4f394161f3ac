// The fused Attention kernels of the CPU backend (runtime/cpu/attention.cpp) against a plain
// reference in double that materialises every score: the forward and its lse unmasked, causal
// and masked (masks broadcast from [Tq, Tk] and [B, 1, 1, Tk]) across query and key blocks;
// the gradient's dQ, dK and dV, with lse passed or recomputed, and a learned mask's gradient; a
// query that sees no key; and
// the refusals, one line each naming the node and the shapes; and the rule by which the CUDA
// tensor-core kernels skip the per-element mask rules on a tile (ops::attention_tile_unmasked).
#include <doctest/doctest.h>
#include <omp.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/format/error.h"
#include "runtime/ops/attention_element.h"
#include "tests/error_of.h"
#include "tests/runtime/attention_util.h"

namespace stagecraft::testing {
namespace {

using attention::check_close;
using attention::Options;
using attention::random;
using rt::Shape;
using rt::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A problem's operands: Q, K, V and the optional mask.
struct Operands {
  Tensor q, k, v;
  std::optional<Tensor> mask;
};

Operands operands(const Shape& q, int64_t tk, int64_t dv, unsigned seed) {
  Shape k = q, v = q;
  k[k.size() - 2] = tk;
  v[v.size() - 2] = tk;
  v.back() = dv;
  return {random(q, seed), random(k, seed + 1), random(v, seed + 2), std::nullopt};
}

// Where in the mask flat index `e` of the scores [lead..., Tq, Tk] reads, by numpy's
// broadcasting.
int64_t mask_offset(const Tensor& mask, const Shape& scores, int64_t e) {
  int64_t offset = 0, stride = 1;
  for (size_t from_end = 0; from_end < scores.size(); ++from_end) {
    const int64_t index = e % scores[scores.size() - 1 - from_end];
    e /= scores[scores.size() - 1 - from_end];
    if (from_end >= mask.shape.size()) continue;
    const int64_t dim = mask.shape[mask.shape.size() - 1 - from_end];
    if (dim != 1) offset += index * stride;
    stride *= dim;
  }
  return offset;
}

double mask_at(const Tensor& mask, const Shape& scores, int64_t e) {
  return mask.as<float>()[mask_offset(mask, scores, e)];
}

// Everything the reference computes, in double.
struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
  std::vector<double> dmask;  ///< The mask's layout: dS summed where the mask broadcasts.
};

// O, lse and, where `d_o` or `dlse` is given (each may be null), the gradients.
Reference reference(const Operands& x, const Options& opt, const Tensor* d_o, const Tensor* dlse) {
  const Shape& qs = x.q.shape;
  const size_t r = qs.size();
  const int64_t tq = qs[r - 2], d = qs[r - 1], tk = x.k.shape[r - 2], dv = x.v.shape[r - 1];
  const int64_t batch = x.q.numel() / (tq * d);
  const double scale = opt.scale != 0.0f ? opt.scale : 1.0 / std::sqrt(static_cast<double>(d));
  Shape scores(qs.begin(), qs.end() - 2);
  scores.push_back(tq);
  scores.push_back(tk);
  const float *q = x.q.as<float>(), *k = x.k.as<float>(), *v = x.v.as<float>();
  Reference ref{
      std::vector<double>(batch * tq * dv), std::vector<double>(batch * tq),
      std::vector<double>(x.q.numel()),     std::vector<double>(x.k.numel()),
      std::vector<double>(x.v.numel()),     std::vector<double>(x.mask ? x.mask->numel() : 0)};
  std::vector<double> s(tk), p(tk), dp(tk);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t row = b * tq + i;
      double top = -kInf;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(q[row * d + c]) * k[(b * tk + j) * d + c];
        s[j] = opt.causal && j > i ? -kInf : scale * dot;
        if (x.mask) s[j] += mask_at(*x.mask, scores, row * tk + j);
        top = std::max(top, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < tk; ++j) sum += top == -kInf ? 0.0 : std::exp(s[j] - top);
      ref.lse[row] = sum > 0 ? top + std::log(sum) : -kInf;
      for (int64_t j = 0; j < tk; ++j) p[j] = sum > 0 ? std::exp(s[j] - ref.lse[row]) : 0.0;
      for (int64_t j = 0; j < tk; ++j)
        for (int64_t c = 0; c < dv; ++c) ref.o[row * dv + c] += p[j] * v[(b * tk + j) * dv + c];
      if (!d_o && !dlse) continue;
      // dP = dO V^T, dS = P (dP - sum_j P dP) + P dlse.
      double delta = 0;
      for (int64_t j = 0; j < tk; ++j) {
        dp[j] = 0;
        for (int64_t c = 0; c < dv && d_o; ++c)
          dp[j] += double(d_o->as<float>()[row * dv + c]) * v[(b * tk + j) * dv + c];
        delta += p[j] * dp[j];
      }
      const double g = dlse ? dlse->as<float>()[row] : 0.0;
      for (int64_t j = 0; j < tk; ++j) {
        const double ds = p[j] * (dp[j] - delta + g);
        if (x.mask) ref.dmask[mask_offset(*x.mask, scores, row * tk + j)] += ds;
        for (int64_t c = 0; c < d; ++c) {
          ref.dq[row * d + c] += scale * ds * k[(b * tk + j) * d + c];
          ref.dk[(b * tk + j) * d + c] += scale * ds * q[row * d + c];
        }
        for (int64_t c = 0; c < dv && d_o; ++c)
          ref.dv[(b * tk + j) * dv + c] += p[j] * d_o->as<float>()[row * dv + c];
      }
    }
  return ref;
}

Shape o_shape(const Operands& x) {
  Shape s = x.q.shape;
  s.back() = x.v.shape.back();
  return s;
}
Shape lse_shape(const Operands& x) { return Shape(x.q.shape.begin(), x.q.shape.end() - 1); }

// The CPU forward's O and lse.
std::pair<Tensor, Tensor> forward(const Operands& x, const Options& opt) {
  Tensor o = Tensor::owned(DType::kFloat32, o_shape(x));
  Tensor lse = Tensor::owned(DType::kFloat32, lse_shape(x));
  attention::run(rt::cpu_backend(), attention::node(opt),
                 {&x.q, &x.k, &x.v, x.mask ? &*x.mask : nullptr}, {&o, &lse});
  return {std::move(o), std::move(lse)};
}

void check_forward(const Operands& x, const Options& opt) {
  CAPTURE(rt::shape_string(x.q.shape));
  CAPTURE(rt::shape_string(x.k.shape));
  CAPTURE(x.mask ? rt::shape_string(x.mask->shape) : "none");
  CAPTURE(opt.causal);
  const auto [o, lse] = forward(x, opt);
  const Reference ref = reference(x, opt, nullptr, nullptr);
  check_close(o, ref.o, 1e-5, "O");
  check_close(lse, ref.lse, 1e-5, "lse");
}

TEST_CASE("a tile is unmasked only where no score of it is masked, and every such tile is") {
  // Every 64 x 64 tile (and 16 x 16: the rule takes any size) of queries and keys, against the
  // per-element rules: in range, a key the query sees, no mask tensor.
  int unmasked_tiles = 0, tiles = 0;
  for (bool causal : {false, true})
    for (bool has_mask : {false, true})
      for (int64_t tq : {1, 63, 64, 100, 256})
        for (int64_t tk : {1, 64, 130, 256})
          for (int64_t size : {16, 64}) {
            rt::ops::AttentionDims s;
            s.batch = 1;
            s.tq = tq;
            s.tk = tk;
            s.causal = causal;
            s.has_mask = has_mask;
            for (int64_t q0 = 0; q0 < tq; q0 += size)
              for (int64_t k0 = 0; k0 < tk; k0 += size) {
                bool every_plain = !has_mask;
                for (int64_t i = q0; i < q0 + size; ++i)
                  for (int64_t j = k0; j < k0 + size; ++j)
                    every_plain &= i < tq && j < rt::ops::attention_keys_seen(s, i);
                CAPTURE(causal);
                CAPTURE(has_mask);
                CAPTURE(tq);
                CAPTURE(tk);
                CAPTURE(q0);
                CAPTURE(k0);
                CHECK(rt::ops::attention_tile_unmasked(s, q0, size, k0, size) == every_plain);
                unmasked_tiles += every_plain;
                ++tiles;
              }
          }
  CHECK(unmasked_tiles > 0);
  CHECK(unmasked_tiles < tiles);
  // GPT-2's causal 1024 x 1024 in 64 x 64 tiles: the 120 below the diagonal skip the rules.
  rt::ops::AttentionDims gpt2;
  gpt2.batch = 96;
  gpt2.tq = gpt2.tk = 1024;
  gpt2.causal = true;
  int below = 0;
  for (int64_t q0 = 0; q0 < 1024; q0 += 64)
    for (int64_t k0 = 0; k0 <= q0; k0 += 64)
      below += rt::ops::attention_tile_unmasked(gpt2, q0, 64, k0, 64);
  CHECK(below == 120);
}

TEST_CASE("Attention forward against a double reference, unmasked, causal and masked") {
  for (int64_t d : {32, 64, 80, 128}) {
    CAPTURE(d);
    const int64_t dv = d == 80 ? 48 : d;
    Operands x = operands({2, 2, 70, d}, 70, dv, static_cast<unsigned>(d));
    check_forward(x, {});
    check_forward(x, {.causal = true});
    x.mask = random({70, 70}, 5, -2, 2);
    check_forward(x, {});
    check_forward(x, {.scale = 0.2f, .causal = true});
    // Padding of batch entry 1: its last 9 keys hidden from every head and query.
    Tensor padding = random({2, 1, 1, 70}, 6, -1, 1);
    for (int64_t j = 61; j < 70; ++j) padding.as<float>()[70 + j] = -INFINITY;
    x.mask = padding;
    check_forward(x, {});
    check_forward(x, {.causal = true});
    // Few queries over many keys (and the reverse), crossing the key blocks.
    Operands wide = operands({2, 2, 5, d}, 130, dv, 10 + static_cast<unsigned>(d));
    check_forward(wide, {});
    check_forward(wide, {.causal = true});
    wide.mask = random({5, 130}, 7, -2, 2);
    check_forward(wide, {.scale = 0.3f});
    check_forward(operands({1, 2, 130, d}, 5, dv, 20), {.causal = true});
    // 3-D operands [N, T, d].
    Operands flat = operands({3, 70, d}, 66, dv, 30 + static_cast<unsigned>(d));
    check_forward(flat, {});
    flat.mask = random({3, 1, 66}, 8, -2, 2);
    check_forward(flat, {.causal = true});
  }
}

TEST_CASE("Attention: a query that sees no key gives O = 0 and lse = -inf") {
  Operands x = operands({2, 3, 9, 16}, 75, 8, 40);
  Tensor mask = random({2, 1, 9, 75}, 41);
  for (int64_t j = 0; j < 75; ++j) mask.as<float>()[(9 + 4) * 75 + j] = -INFINITY;  // b 1, q 4
  x.mask = mask;
  const auto [o, lse] = forward(x, {});
  const Reference ref = reference(x, {}, nullptr, nullptr);
  check_close(o, ref.o, 1e-5, "O");
  check_close(lse, ref.lse, 1e-5, "lse");
  for (int64_t h = 0; h < 3; ++h) {
    const int64_t row = (3 + h) * 9 + 4;
    CHECK(lse.as<float>()[row] == -INFINITY);
    for (int64_t c = 0; c < 8; ++c) CHECK(o.as<float>()[row * 8 + c] == 0.0f);
  }
  // No key at all.
  const auto [empty_o, empty_lse] = forward(operands({2, 4, 8}, 0, 8, 42), {});
  for (int64_t i = 0; i < empty_o.numel(); ++i) CHECK(empty_o.as<float>()[i] == 0.0f);
  for (int64_t i = 0; i < empty_lse.numel(); ++i) CHECK(empty_lse.as<float>()[i] == -INFINITY);
}

// The message of the error the forward throws on these operands, after checking its kind.
std::string forward_error(ErrorKind kind, const Shape& q, const Shape& k, const Shape& v,
                          const Shape& mask, const Options& opt = {}, Shape o = {}) {
  const Tensor tq = random(q, 1), tk = random(k, 2), tv = random(v, 3), tm = random(mask, 4);
  if (o.empty()) {
    o = q;
    o.back() = v.back();
  }
  Tensor out = Tensor::owned(DType::kFloat32, o);
  return error_of(kind, [&] {
    attention::run(rt::cpu_backend(), attention::node(opt),
                   {&tq, &tk, &tv, mask.empty() ? nullptr : &tm}, {&out});
  });
}

TEST_CASE("Attention refuses operands that do not fit, naming the node and the shapes") {
  std::string why = forward_error(ErrorKind::kShape, {4, 8}, {4, 8}, {4, 8}, {});
  CHECK(why.find("Attention 'attn'") != std::string::npos);
  CHECK(why.find("float32[4, 8]") != std::string::npos);
  why = forward_error(ErrorKind::kShape, {2, 5, 8}, {2, 6, 4}, {2, 6, 8}, {});
  CHECK(why.find("K float32[2, 6, 4]") != std::string::npos);
  why = forward_error(ErrorKind::kShape, {2, 5, 8}, {3, 6, 8}, {3, 6, 8}, {});
  CHECK(why.find("Q float32[2, 5, 8]") != std::string::npos);
  why = forward_error(ErrorKind::kShape, {2, 5, 8}, {2, 6, 8}, {2, 7, 8}, {});
  CHECK(why.find("V float32[2, 7, 8]") != std::string::npos);
  why = forward_error(ErrorKind::kShape, {2, 5, 8}, {2, 6, 8}, {2, 6, 8}, {5, 7});
  CHECK(why.find("the mask float32[5, 7] does not broadcast to the scores' shape [2, 5, 6]") !=
        std::string::npos);
  why = forward_error(ErrorKind::kShape, {2, 5, 8}, {2, 6, 8}, {2, 6, 8}, {1, 2, 5, 6});
  CHECK(why.find("float32[1, 2, 5, 6]") != std::string::npos);
  why = forward_error(ErrorKind::kShape, {2, 5, 8}, {2, 6, 8}, {2, 6, 3}, {}, {}, {2, 5, 8});
  CHECK(why.find("[2, 5, 3]") != std::string::npos);
  onnx::NodeProto bad = attention::node({});
  onnx::AttributeProto* causal = bad.add_attribute();
  causal->set_name("causal");
  causal->set_type(onnx::AttributeProto::INT);
  causal->set_i(2);
  const DType f32[] = {DType::kFloat32, DType::kFloat32, DType::kFloat32};
  CHECK(rt::cpu_backend().check({"Attention", f32, {f32, 1}, rt::Attrs(bad)}).find("causal=2") !=
        std::string::npos);
  const Tensor t = random({1, 2, 4}, 1);
  Tensor out = Tensor::owned(DType::kFloat32, {1, 2, 4});
  why = error_of(ErrorKind::kModel, [&] {
    attention::run(rt::cpu_backend(), bad, {&t, &t, &t}, {&out});
  });
  CHECK(why.find("causal=2") != std::string::npos);
}

TEST_CASE("Attention's checks: float32 only, and a mask's gradient only with a mask") {
  const onnx::NodeProto fwd = attention::node({}), grad = attention::node({}, true);
  const rt::Attrs fa(fwd), ga(grad);
  const DType f = DType::kFloat32, none = DType::kUndefined, h = DType::kBFloat16;
  const DType qkv[] = {f, f, f}, qkv_mask[] = {f, f, f, f}, half[] = {h, h, h}, o[] = {f},
              o_lse[] = {f, f}, half_o[] = {h};
  const rt::Backend& cpu = rt::cpu_backend();
  CHECK(cpu.check({"Attention", qkv, o, fa}).empty());
  CHECK(cpu.check({"Attention", qkv_mask, o_lse, fa}).empty());
  // bfloat16 runs widened to float32 by the program (the kernel's own check takes float32).
  CHECK_FALSE(cpu.entry("Attention").check({"Attention", half, half_o, fa}).empty());
  CHECK(cpu.check({"Attention", half, half_o, fa}).empty());
  CHECK(cpu.runs_widened({"Attention", half, half_o, fa}));
  // Q, K, V, mask, O, lse, dO, dlse -> dQ, dK, dV, dmask.
  const DType grad_in[] = {f, f, f, f, f, f, f, none};
  const DType no_dmask[] = {f, f, f, none}, dmask[] = {f, f, f, f};
  CHECK(cpu.check({"AttentionGrad", grad_in, no_dmask, ga}).empty());
  CHECK(cpu.check({"AttentionGrad", grad_in, dmask, ga}).empty());
  Operands x = operands({1, 3, 4}, 3, 4, 50);
  const auto [y, lse] = forward(x, {});
  Tensor dq = Tensor::owned(DType::kFloat32, x.q.shape),
         dm = Tensor::owned(DType::kFloat32, {3, 3});
  const std::string why = error_of(ErrorKind::kModel, [&] {
    attention::run(cpu, grad, {&x.q, &x.k, &x.v, nullptr, &y, &lse, &y, nullptr},
                   {&dq, nullptr, nullptr, &dm});
  });
  CHECK(why ==
        "AttentionGrad 'attn_grad': the mask's gradient (output 3) is asked for without a "
        "mask");
}

// The CPU gradient's dQ, dK and dV, and the mask's as a fourth where `with_dmask`.
std::vector<Tensor> gradient(const Operands& x, const Options& opt, const Tensor& o,
                             const Tensor* lse, const Tensor* d_o, const Tensor* dlse,
                             bool with_dmask = false) {
  std::vector<Tensor> d = {Tensor::owned(DType::kFloat32, x.q.shape),
                           Tensor::owned(DType::kFloat32, x.k.shape),
                           Tensor::owned(DType::kFloat32, x.v.shape)};
  if (with_dmask) d.push_back(Tensor::owned(DType::kFloat32, x.mask->shape));
  attention::run(rt::cpu_backend(), attention::node(opt, true),
                 {&x.q, &x.k, &x.v, x.mask ? &*x.mask : nullptr, &o, lse, d_o, dlse},
                 {&d[0], &d[1], &d[2], with_dmask ? &d[3] : nullptr});
  return d;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

void check_gradient(const Operands& x, const Options& opt, bool with_do, bool with_dlse) {
  CAPTURE(rt::shape_string(x.q.shape));
  CAPTURE(rt::shape_string(x.k.shape));
  CAPTURE(x.mask ? rt::shape_string(x.mask->shape) : "none");
  CAPTURE(opt.causal);
  CAPTURE(with_do);
  CAPTURE(with_dlse);
  const auto [o, lse] = forward(x, opt);
  const Tensor d_o = random(o.shape, 60), dlse = random(lse.shape, 61);
  const Tensor* pd_o = with_do ? &d_o : nullptr;
  const Tensor* pdlse = with_dlse ? &dlse : nullptr;
  const std::vector<Tensor> got = gradient(x, opt, o, &lse, pd_o, pdlse);
  const Reference ref = reference(x, opt, pd_o, pdlse);
  check_close(got[0], ref.dq, 1e-4, "dQ");
  check_close(got[1], ref.dk, 1e-4, "dK");
  check_close(got[2], ref.dv, 1e-4, "dV");
  // lse recomputed: the forward's own bits, so the same gradients bit for bit.
  const std::vector<Tensor> again = gradient(x, opt, o, nullptr, pd_o, pdlse);
  for (size_t k = 0; k < 3; ++k) CHECK_MESSAGE(same_bits(got[k], again[k]), "gradient ", k);
}

TEST_CASE("AttentionGrad against a double reference, lse passed or recomputed") {
  for (int64_t d : {32, 80}) {
    CAPTURE(d);
    Operands x = operands({2, 2, 70, d}, 70, d == 80 ? 48 : d, 70 + static_cast<unsigned>(d));
    check_gradient(x, {}, true, false);
    check_gradient(x, {.causal = true}, true, false);
    Tensor padding = random({2, 1, 1, 70}, 71, -1, 1);
    for (int64_t j = 0; j < 70; ++j)  // batch entry 1, query-independent: keys 50.. hidden
      if (j >= 50) padding.as<float>()[70 + j] = -INFINITY;
    x.mask = padding;
    check_gradient(x, {.scale = 0.25f, .causal = true}, true, true);
    Operands wide = operands({2, 2, 5, d}, 130, 40, 80 + static_cast<unsigned>(d));
    wide.mask = random({5, 130}, 81, -2, 2);
    check_gradient(wide, {}, true, true);
    check_gradient(wide, {.causal = true}, false, true);  // dlse alone
    check_gradient(operands({3, 130, d}, 7, 16, 90), {.causal = true}, true, false);
  }
}

// The gradient takes one pass per batch entry when there are at least 4 entries a thread, else
// a pass over query blocks and one over key blocks: with one thread, 6 entries take the first
// and 3 the second; with 2 threads, the 6 take the second. Each against the reference, and the
// two schedules against each other.
TEST_CASE("AttentionGrad's one-pass and two-pass schedules both give the reference's gradients") {
  struct Threads {
    int before = omp_get_max_threads();
    ~Threads() { omp_set_num_threads(before); }
  } restore;
  for (int64_t d : {32, 64}) {
    CAPTURE(d);
    Operands six = operands({2, 3, 150, d}, 150, d, 110 + static_cast<unsigned>(d));
    Operands three = operands({3, 150, d}, 140, d, 120 + static_cast<unsigned>(d));
    omp_set_num_threads(1);
    check_gradient(six, {.causal = true}, true, false);
    check_gradient(six, {}, true, true);
    check_gradient(three, {.causal = true}, true, true);
    const auto [o, lse] = forward(six, {.causal = true});
    const Tensor d_o = random(o.shape, 130);
    const std::vector<Tensor> one_pass = gradient(six, {.causal = true}, o, &lse, &d_o, nullptr);
    omp_set_num_threads(2);
    const std::vector<Tensor> two_passes = gradient(six, {.causal = true}, o, &lse, &d_o, nullptr);
    for (size_t k = 0; k < 3; ++k)
      check_close(one_pass[k], attention::values(two_passes[k]), 1e-5, "one against two");
  }
}

// A learned mask (a position bias, mask_gradient = 1) gets dS summed over the dims it broadcasts
// along: T5's [1, H, Tq, Tk] over the batch, a [Tq, Tk] one over batch and heads across query
// and key blocks, a per-query [Tq, 1] and a per-key [B, 1, 1, Tk] (no row or no column of its
// own), under causal too, and with every thread count the same bits: T5's 6 entries take the
// one pass by plane on 1 thread (its dS added as it goes) and the mask's own pass on 2, the 8
// entries of the third case the one pass by plane on both.
TEST_CASE("AttentionGrad gives a learned mask its gradient, summed where it broadcasts") {
  struct Threads {
    int before = omp_get_max_threads();
    ~Threads() { omp_set_num_threads(before); }
  } restore;
  const attention::LearnedMaskCase cases[] = {
      {{2, 3, 20, 16}, 20, {1, 3, 20, 20}, {}},
      {{2, 3, 20, 16}, 20, {1, 3, 20, 20}, {.causal = true}},
      {{2, 4, 70, 16}, 150, {1, 4, 70, 150}, {}},
      {{2, 2, 70, 32}, 130, {70, 130}, {.scale = 0.3f}},
      {{2, 2, 70, 32}, 130, {70, 1}, {.causal = true}},
      {{2, 2, 9, 8}, 140, {2, 1, 1, 140}, {}},
      {{3, 5, 8}, 6, {1}, {}},
  };
  unsigned seed = 140;
  for (const attention::LearnedMaskCase& c : cases) {
    Operands x = operands(c.q, c.tk, c.q.back(), seed);
    x.mask = random(c.mask, seed + 3, -1, 1);
    seed += 10;
    CAPTURE(rt::shape_string(x.q.shape));
    CAPTURE(rt::shape_string(x.mask->shape));
    CAPTURE(c.options.causal);
    const auto [o, lse] = forward(x, c.options);
    const Tensor d_o = random(o.shape, seed), dlse = random(lse.shape, seed + 1);
    const Reference ref = reference(x, c.options, &d_o, &dlse);
    omp_set_num_threads(1);
    const std::vector<Tensor> one = gradient(x, c.options, o, &lse, &d_o, &dlse, true);
    check_close(one[3], ref.dmask, 1e-4, "dmask");
    check_close(one[0], ref.dq, 1e-4, "dQ");
    check_close(one[1], ref.dk, 1e-4, "dK");
    omp_set_num_threads(2);
    const std::vector<Tensor> two = gradient(x, c.options, o, &lse, &d_o, &dlse, true);
    CHECK(same_bits(one[3], two[3]));
    // dmask alone: nothing else asked for.
    Tensor alone = Tensor::owned(DType::kFloat32, x.mask->shape);
    attention::run(rt::cpu_backend(), attention::node(c.options, true),
                   {&x.q, &x.k, &x.v, &*x.mask, &o, &lse, &d_o, &dlse},
                   {nullptr, nullptr, nullptr, &alone});
    CHECK(same_bits(one[3], alone));
  }
}

TEST_CASE("AttentionGrad: a query that sees no key takes and gives no gradient") {
  Operands x = operands({2, 9, 16}, 75, 8, 100);
  Tensor mask = random({9, 75}, 101);
  for (int64_t j = 0; j < 75; ++j) mask.as<float>()[4 * 75 + j] = -INFINITY;
  x.mask = mask;
  check_gradient(x, {}, true, true);
}

}  // namespace
}  // namespace stagecraft::testing
