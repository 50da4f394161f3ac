// Recurrent language models (LSTM, GRU, RNN) as torch.onnx exports them, built with the
// samples' builder: planned on 2 devices and run against the unpartitioned model, trained on 2
// devices against one; and the import's refusals of what the kernels do not take.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "compiler/import.h"
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

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

void language_model(const samples::RnnLmOptions& options, const std::string& file) {
  CAPTURE(options.cell);
  CAPTURE(options.bidirectional);
  testing::TempDir dir;
  const std::string model = dir.file(file);
  samples::build_rnn_lm(options).write(model);
  CHECK(testing::run_against_unpartitioned(model, 1, options.cell) == options.layers);
  CHECK(testing::run_against_unpartitioned(model, 2, options.cell) == options.layers);
  testing::check_training(model);
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
    const std::string path = dir.file(op + std::to_string(attrs.size()) + ".onnx");
    b.write(path);
    try {
      import_model(path, {});
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find('\n') == std::string::npos);
      return what;
    }
    return std::string("imported");
  };
  auto has = [](const std::string& what, const std::string& needle) {
    CAPTURE(what);
    CHECK(what.find(needle) != std::string::npos);
  };
  CHECK(refusal("LSTM", {}) == "imported");
  has(refusal("LSTM", {attr_int("layout", 1)}), "layout 1 is not supported");
  has(refusal("GRU", {samples::attr_float("clip", 3.0f)}), "GRU with clip is not supported");
  has(refusal("LSTM", {attr_int("input_forget", 1)}), "input_forget 1");
  has(refusal("GRU", {attr_int("linear_before_reset", 2)}), "linear_before_reset 2");
  auto activations = [](std::vector<std::string> names) {
    onnx::AttributeProto a;
    a.set_name("activations");
    a.set_type(onnx::AttributeProto::STRINGS);
    for (const auto& n : names) a.add_strings(n);
    return a;
  };
  // torch writes nn.RNN's nonlinearity: the default Tanh is taken, Relu is refused.
  CHECK(refusal("RNN", {activations({"Tanh"})}) == "imported");
  has(refusal("RNN", {activations({"Relu"})}), "activations [Relu] are not supported");
  has(refusal("LSTM", {activations({"Sigmoid", "Tanh", "Tanh"}), attr_int("layout", 0),
                       attr_string("direction", "reverse")}, 3),
      "R [1, 16, 3] should be");
}

}  // namespace stagecraft::rt
