// The recurrent language model sample: an embedding, a stack of LSTM, GRU or RNN layers and a
// linear decoder over the vocabulary, written as torch.onnx (opset 17) exports nn.Embedding,
// nn.LSTM(batch_first=True, num_layers=L) and nn.Linear: the batch-first input transposed to
// [seq, batch, feature], one recurrent node per layer with zero initial states built from the
// batch size (Shape, Gather, Concat, ConstantOfShape), Y [seq, dirs, batch, hidden] squeezed
// (one direction) or transposed and reshaped (two) before the next layer.
#include <stdexcept>
#include <string>

#include "samples/builder/sample_models.h"

namespace stagecraft::samples {
namespace {

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;
constexpr int32_t kInt64 = onnx::TensorProto::INT64;

}  // namespace

ModelBuilder build_rnn_lm(const RnnLmOptions& options, const CommonOptions& common) {
  const std::string& cell = options.cell;
  if (cell != "LSTM" && cell != "GRU" && cell != "RNN")
    throw std::invalid_argument("rnn-lm: cell must be LSTM, GRU or RNN, not " + cell);
  if (options.layers < 1 || options.hidden < 1 || options.embed < 1 || options.vocab < 1 ||
      options.seq < 1)
    throw std::invalid_argument("rnn-lm: layers, hidden, embed, vocab and seq must be positive");
  const int64_t gates = cell == "LSTM" ? 4 : cell == "GRU" ? 3 : 1;
  const int64_t dirs = options.bidirectional ? 2 : 1, h = options.hidden;
  ModelBuilder b("rnn_lm", common.seed);
  const Dim batch = common.batch > 0 ? Dim(common.batch) : Dim("batch");
  b.add_input("input_ids", kInt64, {batch, options.seq});
  const std::string table = b.add_parameter("encoder.weight", {options.vocab, options.embed}, 1);
  std::string x = b.add_op("Gather", "/encoder/Gather", {table, "input_ids"});
  x = b.add_op("Transpose", "/rnn/Transpose", {x}, {attr_ints("perm", {1, 0, 2})});
  // Zero initial states [dirs, batch, hidden] from the batch size.
  const std::string shape = b.add_op("Shape", "/rnn/Shape", {"input_ids"});
  const std::string zero = b.add_int64_buffer("rnn.batch_index", {}, {0});
  const std::string n = b.add_op("Gather", "/rnn/Gather", {shape, zero}, {attr_int("axis", 0)});
  const std::string axes0 = b.add_int64_buffer("rnn.axes0", {1}, {0});
  const std::string n1 = b.add_op("Unsqueeze", "/rnn/Unsqueeze", {n, axes0});
  const std::string d = b.add_int64_buffer("rnn.dirs", {1}, {dirs});
  const std::string hid = b.add_int64_buffer("rnn.hidden", {1}, {h});
  const std::string dims = b.add_op("Concat", "/rnn/Concat", {d, n1, hid}, {attr_int("axis", 0)});
  const std::string h0 = b.add_op("ConstantOfShape", "/rnn/ConstantOfShape", {dims},
                                  {attr_tensor("value", make_float_tensor({1}, {0.0f}))});
  const std::string axes1 = b.add_int64_buffer("rnn.axes1", {1}, {1});
  int64_t in = options.embed;
  for (int64_t l = 0; l < options.layers; ++l) {
    const std::string id = std::to_string(l);
    const std::string w = b.add_parameter("rnn.weight_ih_l" + id, {dirs, gates * h, in}, h);
    const std::string r = b.add_parameter("rnn.weight_hh_l" + id, {dirs, gates * h, h}, h);
    const std::string bias = b.add_parameter("rnn.bias_l" + id, {dirs, 2 * gates * h}, h);
    std::vector<std::string> inputs{x, w, r, bias, "", h0};
    std::vector<std::string> outputs{"/rnn/" + cell + "_" + id + "_Y",
                                     "/rnn/" + cell + "_" + id + "_Y_h"};
    if (cell == "LSTM") {
      inputs.push_back(h0);
      outputs.push_back("/rnn/" + cell + "_" + id + "_Y_c");
    }
    std::vector<onnx::AttributeProto> attrs{attr_int("hidden_size", h)};
    if (options.bidirectional) attrs.push_back(attr_string("direction", "bidirectional"));
    if (cell == "GRU") attrs.push_back(attr_int("linear_before_reset", 1));  // as torch's
    const std::string y = b.add_node(cell, "/rnn/" + cell + "_" + id, inputs, outputs, attrs)[0];
    if (dirs == 1) {
      x = b.add_op("Squeeze", "/rnn/Squeeze_" + id, {y, axes1});
    } else {
      x = b.add_op("Transpose", "/rnn/Transpose_" + id, {y}, {attr_ints("perm", {0, 2, 1, 3})});
      const std::string flat = b.add_int64_buffer("rnn.flat_" + id, {3}, {0, 0, -1});
      x = b.add_op("Reshape", "/rnn/Reshape_" + id, {x, flat});
    }
    in = dirs * h;
  }
  x = b.add_op("Transpose", "/decoder/Transpose", {x}, {attr_ints("perm", {1, 0, 2})});
  const std::string wd = b.add_parameter("decoder.weight_t", {in, options.vocab}, in);
  const std::string bd = b.add_parameter("decoder.bias", {options.vocab}, in);
  x = b.add_op("MatMul", "/decoder/MatMul", {x, wd});
  b.add_node("Add", "/decoder/Add", {x, bd}, {"logits"});
  b.add_output("logits", kFloat, {batch, options.seq, options.vocab});
  return b;
}

}  // namespace stagecraft::samples
