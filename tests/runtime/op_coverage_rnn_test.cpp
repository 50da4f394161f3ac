// Recurrent language models (LSTM, GRU, RNN) as torch.onnx exports them, built with the
// samples' builder: planned on 2 devices and run against the unpartitioned model, trained on 2
// devices against one; and the import's refusals of what the kernels do not take.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/error.h"
#include "samples/builder/model_builder.h"
#include "samples/builder/sample_models.h"
#include "tests/runtime/op_coverage_util.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using samples::attr_int;
using samples::attr_string;
using samples::ModelBuilder;
using testing::check_contains;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

void language_model(const samples::RnnLmOptions& options, const std::string& file) {
  CAPTURE(options.cell);
  CAPTURE(options.bidirectional);
  testing::TempDir dir;
  const std::string model = dir.file(file);
  samples::build_rnn_lm(options).write(model);
  testing::check_plans_and_training(model, options.cell, options.layers);
}

std::vector<float> random_values(int64_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-0.8f, 0.8f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& f : v) f = u(gen);
  return v;
}

// Direction 0 of a bidirectional node equals a forward node with the first halves of W, R, B
// and the initial states; direction 1 a reverse node with the second halves; and a reverse
// node equals a forward node on X reversed in time, its Y reversed (the definition of
// "reverse", checked against the forward path the ONNX conformance cases test).
void check_directions(const std::string& op, int64_t lbr = -1) {
  CAPTURE(op);
  CAPTURE(lbr);
  const int64_t t = 4, b = 3, in = 5, h = 4, g = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
  const bool lstm = op == "LSTM";
  testing::TempDir dir;
  ModelBuilder mb("directions");
  mb.add_input("x", kFloat, {t, b, in});
  mb.add_input("xr", kFloat, {t, b, in});
  const std::vector<float> w = random_values(2 * g * h * in, 1), r = random_values(2 * g * h * h, 2),
                           bias = random_values(2 * 2 * g * h, 3), h0 = random_values(2 * b * h, 4),
                           c0 = random_values(2 * b * h, 5);
  auto half = [](const std::vector<float>& v, int64_t d) {
    const size_t n = v.size() / 2;
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(d * n),
                              v.begin() + static_cast<std::ptrdiff_t>((d + 1) * n));
  };
  struct Operands {
    std::string w, r, b, h0, c0;
  };
  auto operands = [&](const std::string& tag, int64_t dirs, int64_t d) {
    auto pick = [&](const std::vector<float>& v) { return dirs == 2 ? v : half(v, d); };
    Operands o;
    o.w = mb.add_float_buffer("W" + tag, {dirs, g * h, in}, pick(w));
    o.r = mb.add_float_buffer("R" + tag, {dirs, g * h, h}, pick(r));
    o.b = mb.add_float_buffer("B" + tag, {dirs, 2 * g * h}, pick(bias));
    o.h0 = mb.add_float_buffer("H0" + tag, {dirs, b, h}, pick(h0));
    o.c0 = mb.add_float_buffer("C0" + tag, {dirs, b, h}, pick(c0));
    return o;
  };
  auto node = [&](const std::string& name, const std::string& x, const Operands& o,
                  const std::string& direction) {
    std::vector<std::string> inputs{x, o.w, o.r, o.b, "", o.h0};
    if (lstm) inputs.push_back(o.c0);
    std::vector<onnx::AttributeProto> attrs{attr_int("hidden_size", h),
                                            attr_string("direction", direction)};
    if (lbr >= 0) attrs.push_back(attr_int("linear_before_reset", lbr));
    mb.add_node(op, "/" + name, inputs, {name + "_y", name + "_yh"}, attrs);
  };
  node("bi", "x", operands("bi", 2, 0), "bidirectional");
  node("f", "x", operands("f", 1, 0), "forward");
  const Operands second = operands("r", 1, 1);
  node("r", "x", second, "reverse");
  node("g", "xr", second, "forward");
  for (const char* name : {"bi", "f", "r", "g"}) {
    const int64_t dirs = std::string(name) == "bi" ? 2 : 1;
    mb.add_output(std::string(name) + "_y", kFloat, {t, dirs, b, h});
  }
  mb.add_output("r_yh", kFloat, {1, b, h});
  mb.write(dir.file("m.onnx"));
  const ImportedModel model = import_model(dir.file("m.onnx"), {});
  Program p = Program::from_model(ir::model_from_graph(model.graph), cpu_backend(), "m");
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(p.arena_bytes()) + 64);
  const std::vector<float> x = random_values(t * b * in, 6);
  std::vector<Tensor> inputs{Tensor::owned(DType::kFloat32, {t, b, in}),
                             Tensor::owned(DType::kFloat32, {t, b, in})};
  for (int64_t s = 0; s < t; ++s)
    for (int64_t i = 0; i < b * in; ++i) {
      inputs[0].as<float>()[s * b * in + i] = x[static_cast<size_t>(s * b * in + i)];
      inputs[1].as<float>()[s * b * in + i] = x[static_cast<size_t>((t - 1 - s) * b * in + i)];
    }
  const std::vector<Tensor> out = p.run(*device, inputs, arena.data());
  REQUIRE(out.size() == 5);
  const float *bi = out[0].as<float>(), *f = out[1].as<float>(), *rv = out[2].as<float>(),
              *gv = out[3].as<float>(), *rh = out[4].as<float>();
  const int64_t bh = b * h;
  double worst = 0, scale = 0;
  auto compare = [&](float got, float want) {
    worst = std::max(worst, static_cast<double>(std::fabs(got - want)));
    scale = std::max(scale, static_cast<double>(std::fabs(want)));
  };
  for (int64_t s = 0; s < t; ++s)
    for (int64_t e = 0; e < bh; ++e) {
      compare(bi[(s * 2 + 0) * bh + e], f[s * bh + e]);
      compare(bi[(s * 2 + 1) * bh + e], rv[s * bh + e]);
      compare(rv[s * bh + e], gv[(t - 1 - s) * bh + e]);
    }
  for (int64_t e = 0; e < bh; ++e) compare(rh[e], rv[e]);  // reverse ends at step 0
  CHECK(worst <= 1e-6);
  CHECK(scale > 0.05);
}

const DType kRnnInputs[] = {DType::kFloat32,   DType::kFloat32, DType::kFloat32, DType::kFloat32,
                            DType::kUndefined, DType::kFloat32, DType::kFloat32};

}  // namespace

TEST_CASE("an LSTM language model: planned on 2 devices, run and trained as on one") {
  language_model({.cell = "LSTM", .layers = 2, .vocab = 16, .embed = 8, .hidden = 8, .seq = 5},
                 "lstm.onnx");
  testing::check_cuda_accepts("LSTM", kRnnInputs);
}

TEST_CASE("a bidirectional GRU and an RNN language model: 2 devices as one, trained") {
  language_model({.cell = "GRU",
                  .layers = 2,
                  .vocab = 16,
                  .embed = 8,
                  .hidden = 6,
                  .seq = 4,
                  .bidirectional = true},
                 "gru.onnx");
  language_model({.cell = "RNN", .layers = 2, .vocab = 16, .embed = 8, .hidden = 8, .seq = 4},
                 "rnn.onnx");
  testing::check_cuda_accepts("GRU", std::span(kRnnInputs, 6));
  testing::check_cuda_accepts("RNN", std::span(kRnnInputs, 6));
}

TEST_CASE("bidirectional and reverse LSTM, GRU and RNN agree with forward nodes") {
  check_directions("LSTM");
  check_directions("GRU", 0);
  check_directions("GRU", 1);
  check_directions("RNN");
}

TEST_CASE("recurrent refusals at import: one line naming the node and the numbers") {
  testing::TempDir dir;
  auto refusal = [&](const std::string& op, std::vector<onnx::AttributeProto> attrs,
                     int64_t r_hidden = 4) {
    ModelBuilder b("refused");
    const int64_t g = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
    b.add_input("x", kFloat, {3, 2, 5});
    const std::string w = b.add_parameter("W", {1, g * 4, 5}, 4);
    const std::string r = b.add_parameter("R", {1, g * 4, r_hidden}, 4);
    attrs.push_back(attr_int("hidden_size", 4));
    b.add_node(op, "/rnn/" + op, {"x", w, r}, {"y", "y_h"}, attrs);
    b.add_output("y", kFloat, {"s", "d", "b", "h"});
    return testing::import_message(b, dir.file(op + std::to_string(attrs.size()) + ".onnx"));
  };
  CHECK(refusal("LSTM", {}) == "imported");
  check_contains(refusal("LSTM", {attr_int("layout", 1)}), "layout 1 is not supported");
  check_contains(refusal("GRU", {samples::attr_float("clip", 3.0f)}),
                 "GRU with clip is not supported");
  check_contains(refusal("LSTM", {attr_int("input_forget", 1)}), "input_forget 1");
  check_contains(refusal("GRU", {attr_int("linear_before_reset", 2)}), "linear_before_reset 2");
  auto activations = [](std::vector<std::string> names) {
    onnx::AttributeProto a;
    a.set_name("activations");
    a.set_type(onnx::AttributeProto::STRINGS);
    for (const auto& n : names) a.add_strings(n);
    return a;
  };
  // torch writes nn.RNN's nonlinearity: the default Tanh is taken, Relu is refused.
  CHECK(refusal("RNN", {activations({"Tanh"})}) == "imported");
  check_contains(refusal("RNN", {activations({"Relu"})}), "activations [Relu] are not supported");
  check_contains(refusal("LSTM",
                         {activations({"Sigmoid", "Tanh", "Tanh"}), attr_int("layout", 0),
                          attr_string("direction", "reverse")},
                         3),
                 "R [1, 16, 3] should be");
}

}  // namespace stagecraft::rt
