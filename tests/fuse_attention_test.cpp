// fuse-attention (passes/fuse_attention.cpp) on the spellings exporters write: the bundled GPT
// (HF GPT-2's Where with a constant causal mask), an additive mask input, torch 2.x's SDPA export
// (sqrt(scale) on Q and on K^T), and the near-misses that must stay unfused with a reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "compiler/import.h"
#include "passes/autodiff.h"
#include "runtime/format/grad_ops.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using testing::add_node;

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

std::vector<const ir::Node*> nodes_of(const ir::Graph& g, std::string_view op) {
  std::vector<const ir::Node*> out;
  for (const ir::Node& n : g.nodes())
    if (!n.dead && n.op_type == op) out.push_back(&n);
  return out;
}

void add_scalar(onnx::GraphProto* g, const std::string& name, float value) {
  onnx::TensorProto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_float_data(value);
}

/// q, k, v [2, 3, 5, 4] -> MatMul(q, Transpose(k)) * 0.5 + mask [5, 5] -> Softmax -> MatMul v.
/// `extra` adds the near-miss under test.
onnx::ModelProto additive_mask_model(const std::string& extra = "") {
  onnx::ModelProto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_input();
  g->clear_output();
  for (const char* name : {"q", "k", "v"})
    testing::add_tensor_info(g->add_input(), name, onnx::TensorProto::FLOAT, {2, 3, 5, 4});
  testing::add_tensor_info(g->add_input(), "mask", onnx::TensorProto::FLOAT, {5, 5});
  testing::add_tensor_info(g->add_output(), "o", onnx::TensorProto::FLOAT, {2, 3, 5, 4});
  add_scalar(g, "half", 0.5f);
  auto* t = add_node(g, "Transpose", {"k"}, {"kt"}, "/attn/Transpose");
  auto* perm = t->add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::INTS);
  for (int64_t p : {0, 1, 3, 2}) perm->add_ints(p);
  add_node(g, "MatMul", {"q", "kt"}, {"s"}, "/attn/MatMul");
  add_node(g, "Mul", {"s", "half"}, {"scaled"}, "/attn/Mul");
  std::string mask = "mask", scores = "scaled";
  if (extra == "mask made by a Mul, first") {
    // Hugging Face's (1 - attention_mask) * min, the left operand of the Add.
    add_scalar(g, "one", 1.0f);
    add_scalar(g, "lowest", -3.4028234663852886e38f);
    add_node(g, "Sub", {"one", "mask"}, {"dropped"}, "/Sub");
    add_node(g, "Mul", {"dropped", "lowest"}, {"extended"}, "/Mul");
    mask = "extended";
  }
  if (extra == "mask from a weight") {
    // A learned relative position bias: a table gathered by constant indices (Swin, T5).
    testing::add_float_initializer(g, "bias_table", {9});
    std::vector<int64_t> index;
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 5; ++j) index.push_back(i - j + 4);
    testing::add_int64_initializer(g, "bias_index", index)->add_dims(5);
    g->mutable_initializer(g->initializer_size() - 1)->set_dims(0, 5);
    add_node(g, "Gather", {"bias_table", "bias_index"}, {"bias"}, "/Gather");
    mask = "bias";
  }
  if (extra == "where and add" || extra == "where removes a row") {
    // A Where with a constant condition: causal, or (second) one whose query 2 keeps no key.
    onnx::TensorProto* cond = g->add_initializer();
    cond->set_name("cond");
    cond->set_data_type(onnx::TensorProto::BOOL);
    cond->add_dims(5);
    cond->add_dims(5);
    std::string bytes;
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 5; ++j)
        bytes.push_back(extra == "where and add" ? j <= i : (i != 2 && j != 4));
    cond->set_raw_data(bytes);
    add_scalar(g, "fill", -INFINITY);
    add_node(g, "Where", {"cond", "scaled", "fill"}, {"cut"}, "/attn/Where");
    scores = "cut";
  }
  if (extra == "where removes a row")
    add_node(g, "Identity", {"cut"}, {"masked"}, "/attn/Identity");
  else if (mask == "extended")
    add_node(g, "Add", {mask, scores}, {"masked"}, "/attn/Add");
  else
    add_node(g, "Add", {scores, mask}, {"masked"}, "/attn/Add");
  add_node(g, "Softmax", {"masked"}, {"p"}, "/attn/Softmax");
  add_node(g, "MatMul", {"p", "v"}, {"o"}, "/attn/MatMul_1");
  if (extra == "probabilities out")
    testing::add_tensor_info(g->add_output(), "p", onnx::TensorProto::FLOAT, {2, 3, 5, 5});
  if (extra == "training dropout") {
    g->mutable_node(g->node_size() - 1)->set_input(0, "pd");
    add_scalar(g, "ratio", 0.1f);
    onnx::TensorProto* on = g->add_initializer();
    on->set_name("on");
    on->set_data_type(onnx::TensorProto::BOOL);
    on->add_int32_data(1);
    add_node(g, "Dropout", {"p", "ratio", "on"}, {"pd"}, "/attn/Dropout");
  }
  return m;
}

ImportedModel import_built(const onnx::ModelProto& m, bool fuse = true, bool training = false) {
  testing::TempDir dir;
  testing::write_model(m, dir.file("m.onnx"));
  ImportOptions options;
  options.fuse_attention = fuse;
  options.training = training;
  return import_model(dir.file("m.onnx"), options);
}

TEST_CASE("fuse-attention: the bundled GPT's causal Where masks become causal Attention nodes") {
  ImportOptions options;
  options.batch = 2;
  options.dims["seq"] = 16;
  options.fuse_attention = true;
  const ImportedModel unfused = [&] {
    ImportOptions off = options;
    off.fuse_attention = false;
    return import_model(sample("gpt_tiny.onnx"), off);
  }();
  const size_t softmaxes = nodes_of(unfused.graph, "Softmax").size();
  REQUIRE(softmaxes > 0);
  const ImportedModel m = import_model(sample("gpt_tiny.onnx"), options);
  const auto fused = nodes_of(m.graph, "Attention");
  CHECK(fused.size() == softmaxes);
  CHECK(nodes_of(m.graph, "Softmax").empty());
  CHECK(nodes_of(m.graph, "Where").size() + softmaxes == nodes_of(unfused.graph, "Where").size());
  CHECK(m.folded.at("fuse-attention") == static_cast<int64_t>(softmaxes));
  CHECK(m.attention_not_fused.empty());
  for (const ir::Node* n : fused) {
    CAPTURE(n->name);
    CHECK(n->domain == grad::kGradDomain);
    CHECK(n->attr_int("causal", 0) == 1);
    CHECK(n->inputs.size() == 3);  // no mask tensor
    CHECK(n->attr_float("scale", 0) == doctest::Approx(0.25));  // Div by sqrt(16)
    const ir::Value& q = m.graph.value(n->inputs[0]);
    const ir::Value& k = m.graph.value(n->inputs[1]);
    CHECK(q.shape == k.shape);  // K, not K^T
    const ir::Value& lse = m.graph.value(n->outputs[1]);
    CHECK(lse.shape == std::vector<int64_t>(q.shape.begin(), q.shape.end() - 1));
  }
  CHECK(m.graph.opset_imports.at(std::string(grad::kGradDomain)) == grad::kGradDomainVersion);
}

TEST_CASE("fuse-attention: an added mask input stays an input, the scale is read, K^T untransposed") {
  const ImportedModel m = import_built(additive_mask_model());
  const auto fused = nodes_of(m.graph, "Attention");
  REQUIRE(fused.size() == 1);
  const ir::Node& n = *fused[0];
  CHECK(n.attr_float("scale", 0) == doctest::Approx(0.5));
  CHECK(n.attr_int("causal", 1) == 0);
  REQUIRE(n.inputs.size() == 4);
  CHECK(m.graph.value(n.inputs[0]).name == "q");
  // K^T was Transpose(k, [0,1,3,2]): with the last two dims swapped back it is k itself.
  CHECK(m.graph.value(n.inputs[1]).name == "k");
  CHECK(m.graph.value(n.inputs[2]).name == "v");
  CHECK(m.graph.value(n.inputs[3]).name == "mask");
  CHECK(m.graph.value(n.outputs[0]).name == "o");
  CHECK(nodes_of(m.graph, "Transpose").empty());
  CHECK(nodes_of(m.graph, "MatMul").empty());
  CHECK(m.graph.live_nodes() == 1);
}

TEST_CASE("fuse-attention: the mask is the Add's operand that is not the scores, either side") {
  // (1 - mask) * min + scores: a Mul by a scalar on the left is the mask, not a scale.
  const ImportedModel m = import_built(additive_mask_model("mask made by a Mul, first"));
  const auto fused = nodes_of(m.graph, "Attention");
  REQUIRE(fused.size() == 1);
  REQUIRE(fused[0]->inputs.size() == 4);
  CHECK(m.graph.value(fused[0]->inputs[3]).name == "extended");
  CHECK(fused[0]->attr_float("scale", 0) == doctest::Approx(0.5));
  CHECK(m.attention_not_fused.empty());
}

TEST_CASE("fuse-attention: torch 2.x's SDPA export, sqrt(scale) on Q and on K^T") {
  onnx::ModelProto model = additive_mask_model();
  auto* g = model.mutable_graph();
  // q' = q * 0.5, kt' = kt * 0.5, scores = q' kt' (no scale after), then the mask.
  add_scalar(g, "root", 0.5f);
  for (int i = 0; i < g->node_size(); ++i) {
    onnx::NodeProto* n = g->mutable_node(i);
    if (n->op_type() == "MatMul" && n->input(0) == "q") {
      n->set_input(0, "qs");
      n->set_input(1, "kts");
    }
    if (n->op_type() == "Mul") {
      n->set_op_type("Identity");
      n->mutable_input()->RemoveLast();
    }
  }
  add_node(g, "Mul", {"q", "root"}, {"qs"}, "/attn/Mul_q");
  add_node(g, "Mul", {"kt", "root"}, {"kts"}, "/attn/Mul_k");
  const ImportedModel m = import_built(model);
  const auto fused = nodes_of(m.graph, "Attention");
  REQUIRE(fused.size() == 1);
  CHECK(fused[0]->attr_float("scale", 0) == doctest::Approx(0.25));
  CHECK(m.graph.value(fused[0]->inputs[0]).name == "q");
  CHECK(nodes_of(m.graph, "Mul").empty());
}

/// Four attention blocks over q, k, v [1, 1, 260, 4], each masked by Where(Slice(buffer), scores,
/// -inf) of one bool buffer [300, 300] holding j <= i (too large for folding: the slices stay
/// nodes, as HF GPT-2's do). Blocks "a" and "b" slice rows and columns 0..260 with constants of
/// their own (equal bytes), block "c" rows 1..261: row i keeps j <= i + 1, not causal; block "d"
/// block a's slice with negative bounds and axes.
onnx::ModelProto sliced_buffer_model() {
  onnx::ModelProto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_input();
  g->clear_output();
  constexpr int64_t kBuffer = 300, kSeq = 260;
  for (const char* name : {"q", "k", "v"})
    testing::add_tensor_info(g->add_input(), name, onnx::TensorProto::FLOAT, {1, 1, kSeq, 4});
  onnx::TensorProto* buffer = g->add_initializer();
  buffer->set_name("causal_buffer");
  buffer->set_data_type(onnx::TensorProto::BOOL);
  buffer->add_dims(kBuffer);
  buffer->add_dims(kBuffer);
  std::string bytes;
  for (int64_t i = 0; i < kBuffer; ++i)
    for (int64_t j = 0; j < kBuffer; ++j) bytes.push_back(j <= i ? 1 : 0);
  buffer->set_raw_data(bytes);
  add_scalar(g, "two", 2.0f);
  add_scalar(g, "fill", -INFINITY);
  for (const auto& [block, row] :
       {std::pair{"a", 0}, std::pair{"b", 0}, std::pair{"c", 1}, std::pair{"d", 0}}) {
    const std::string p = std::string("/") + block + "/";
    if (std::string(block) == "d") {
      // Block a's bounds as exporters also write them: counted from the end, the axes
      // negative, the steps given.
      testing::add_int64_initializer(g, p + "starts", {-kBuffer, -kBuffer});
      testing::add_int64_initializer(g, p + "ends", {kSeq - kBuffer, kSeq - kBuffer});
      testing::add_int64_initializer(g, p + "axes", {-2, -1});
      testing::add_int64_initializer(g, p + "steps", {1, 1});
      add_node(g, "Slice", {"causal_buffer", p + "starts", p + "ends", p + "axes", p + "steps"},
               {p + "cond"}, p + "Slice");
    } else {
      testing::add_int64_initializer(g, p + "starts", {row, 0});
      testing::add_int64_initializer(g, p + "ends", {row + kSeq, kSeq});
      testing::add_int64_initializer(g, p + "axes", {0, 1});
      add_node(g, "Slice", {"causal_buffer", p + "starts", p + "ends", p + "axes"}, {p + "cond"},
               p + "Slice");
    }
    auto* t = add_node(g, "Transpose", {"k"}, {p + "kt"}, p + "Transpose");
    auto* perm = t->add_attribute();
    perm->set_name("perm");
    perm->set_type(onnx::AttributeProto::INTS);
    for (int64_t d : {0, 1, 3, 2}) perm->add_ints(d);
    add_node(g, "MatMul", {"q", p + "kt"}, {p + "s"}, p + "MatMul");
    add_node(g, "Div", {p + "s", "two"}, {p + "scaled"}, p + "Div");
    add_node(g, "Where", {p + "cond", p + "scaled", "fill"}, {p + "masked"}, p + "Where");
    add_node(g, "Softmax", {p + "masked"}, {p + "probs"}, p + "Softmax");
    add_node(g, "MatMul", {p + "probs", "v"}, {std::string("o_") + block}, p + "MatMul_1");
    testing::add_tensor_info(g->add_output(), std::string("o_") + block, onnx::TensorProto::FLOAT,
                             {1, 1, kSeq, 4});
  }
  return m;
}

TEST_CASE("fuse-attention: slices of one mask buffer are told apart by their bounds") {
  // The pass evaluates each distinct mask once (by its producer and its constants' bytes):
  // equal bounds in separate constants share the evaluation, other bounds do not.
  const ImportedModel m = import_built(sliced_buffer_model());
  REQUIRE(nodes_of(m.graph, "Attention").size() == 4);
  for (const ir::Node* n : nodes_of(m.graph, "Attention")) {
    const std::string out = m.graph.value(n->outputs[0]).name;
    CAPTURE(out);
    const bool causal = out != "o_c";
    CHECK(n->attr_int("causal", -1) == (causal ? 1 : 0));
    REQUIRE(n->inputs.size() == (causal ? 3u : 4u));
    if (causal) continue;
    // Row i of block c keeps the keys j <= i + 1: 0 there, -inf elsewhere.
    const ir::Value& mask = m.graph.value(n->inputs[3]);
    REQUIRE(mask.is_initializer());
    const auto raw = mask.initializer->bytes();
    REQUIRE(raw.size() == 260u * 260u * sizeof(float));
    const auto* values = reinterpret_cast<const float*>(raw.data());
    int wrong = 0;
    for (int i = 0; i < 260; ++i)
      for (int j = 0; j < 260; ++j)
        wrong += (values[i * 260 + j] == 0.0f) != (j <= i + 1);
    CHECK(wrong == 0);
  }
  CHECK(nodes_of(m.graph, "Slice").empty());
}

TEST_CASE("fuse-attention: near-misses stay as exported, each named with its reason") {
  SUBCASE("the probabilities are a graph output") {
    const ImportedModel m = import_built(additive_mask_model("probabilities out"));
    CHECK(nodes_of(m.graph, "Attention").empty());
    CHECK(nodes_of(m.graph, "Softmax").size() == 1);
    REQUIRE(m.attention_not_fused.size() == 1);
    CHECK(m.attention_not_fused[0].find("/attn/Softmax") != std::string::npos);
    CHECK(m.attention_not_fused[0].find("graph output") != std::string::npos);
  }
  SUBCASE("dropout on the probabilities in training mode") {
    const ImportedModel m = import_built(additive_mask_model("training dropout"));
    CHECK(nodes_of(m.graph, "Attention").empty());
    REQUIRE(m.attention_not_fused.size() == 1);
    CHECK(m.attention_not_fused[0].find("dropout on the probabilities in training mode") !=
          std::string::npos);
  }
  SUBCASE("a Where mask and an added mask together") {
    // Hugging Face's GPT-2 given an attention_mask: Add(Where(causal, scores, fill), mask). A
    // left-padded row's queries keep only keys the Where removed: the exported graph passes no
    // gradient to those scores, one additive mask would.
    const ImportedModel m = import_built(additive_mask_model("where and add"));
    CHECK(nodes_of(m.graph, "Attention").empty());
    REQUIRE(m.attention_not_fused.size() == 1);
    CHECK(m.attention_not_fused[0].find("a Where mask and an added mask together") !=
          std::string::npos);
  }
  SUBCASE("a Where mask that leaves a query no key") {
    const ImportedModel m = import_built(additive_mask_model("where removes a row"));
    CHECK(nodes_of(m.graph, "Attention").empty());
    REQUIRE(m.attention_not_fused.size() == 1);
    CHECK(m.attention_not_fused[0].find("removes every key of some query") != std::string::npos);
  }
  SUBCASE("without --fuse-attention") {
    const ImportedModel m = import_built(additive_mask_model(), false);
    CHECK(nodes_of(m.graph, "Attention").empty());
    CHECK(m.attention_not_fused.empty());
    CHECK(m.folded.count("fuse-attention") == 0);
  }
}

// A learned relative position bias (Swin, T5) fuses in a training import too: the node's
// mask_gradient = 1 makes its mask an input the backward differentiates (passes::
// differentiable_at), so the bias table trains through it; a mask no weight's gradient flows
// through (a graph input, as a padding mask) gets none, nor does any mask in an inference import.
TEST_CASE("fuse-attention: a mask made from a trainable weight fuses and takes a gradient") {
  const ImportedModel trained = import_built(additive_mask_model("mask from a weight"), true, true);
  auto fused = nodes_of(trained.graph, "Attention");
  REQUIRE(fused.size() == 1);
  CHECK(trained.attention_not_fused.empty());
  CHECK(fused[0]->attr_int("mask_gradient", 0) == 1);
  CHECK(passes::differentiable_at(*fused[0], 3));
  CHECK(passes::differentiable_at(*fused[0], 0));
  const ImportedModel served = import_built(additive_mask_model("mask from a weight"));
  fused = nodes_of(served.graph, "Attention");
  REQUIRE(fused.size() == 1);
  CHECK(fused[0]->attr_int("mask_gradient", 0) == 0);
  CHECK_FALSE(passes::differentiable_at(*fused[0], 3));
  const ImportedModel input_mask = import_built(additive_mask_model(), true, true);
  fused = nodes_of(input_mask.graph, "Attention");
  REQUIRE(fused.size() == 1);
  CHECK_FALSE(passes::differentiable_at(*fused[0], 3));
}

}  // namespace
}  // namespace stagecraft
