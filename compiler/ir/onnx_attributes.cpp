// Attribute checks before ONNX shape inference (onnx_attributes.h): the numbers libonnx divides
// by, loops over or negates without looking.
#include "compiler/ir/onnx_attributes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/ir/onnx_bridge.h"
#include "runtime/format/error.h"

namespace stagecraft::ir {
namespace {

/// At most this many values of an attribute are shown in a message.
constexpr std::size_t kShownValues = 8;

std::string shown(const google::protobuf::RepeatedField<int64_t>& values) {
  std::vector<int64_t> head(values.begin(),
                            values.begin() + std::min<int>(values.size(), kShownValues));
  return fmt::format("[{}{}]", fmt::join(head, ", "),
                     static_cast<std::size_t>(values.size()) > kShownValues ? ", ..." : "");
}

/// The lowest value each integer attribute of this name may hold; nullopt for names not checked.
std::optional<int64_t> attribute_floor(const std::string& op, const std::string& name) {
  if (name == "kernel_shape" || name == "strides" || name == "dilations") return 1;
  if (name == "group" || name == "blocksize") return 1;
  if (name == "output_padding") return 0;
  // Pad's `pads` attribute (opset < 11) may be negative: it crops.
  if (name == "pads" && op != "Pad") return 0;
  return std::nullopt;
}

/// The values of a small integer tensor held in the model (int32 or int64, typed fields or raw
/// bytes); nullopt for external data, other dtypes or a byte count that does not match.
std::optional<std::vector<int64_t>> small_ints(const onnx::TensorProto& t) {
  constexpr int64_t kMaxValues = 1 << 16;
  if (t.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
  std::vector<int64_t> out;
  if (t.data_type() == onnx::TensorProto::INT64) {
    if (!t.has_raw_data()) return std::vector<int64_t>(t.int64_data().begin(), t.int64_data().end());
    if (t.raw_data().size() % 8 != 0 || t.raw_data().size() / 8 > kMaxValues) return std::nullopt;
    out.resize(t.raw_data().size() / 8);
    std::memcpy(out.data(), t.raw_data().data(), t.raw_data().size());
    return out;
  }
  if (t.data_type() == onnx::TensorProto::INT32) {
    if (!t.has_raw_data()) return std::vector<int64_t>(t.int32_data().begin(), t.int32_data().end());
    if (t.raw_data().size() % 4 != 0 || t.raw_data().size() / 4 > kMaxValues) return std::nullopt;
    for (std::size_t i = 0; i < t.raw_data().size(); i += 4) {
      int32_t v = 0;
      std::memcpy(&v, t.raw_data().data() + i, 4);
      out.push_back(v);
    }
    return out;
  }
  return std::nullopt;
}

using Constants = std::unordered_map<std::string, const onnx::TensorProto*>;

/// Adds the constant tensors of `g` by name to `out`: initializers and Constant nodes' `value`.
void add_constants(const onnx::GraphProto& g, Constants& out) {
  for (const auto& t : g.initializer()) out[t.name()] = &t;
  for (const auto& n : g.node()) {
    if (n.op_type() != "Constant" || !(n.domain().empty() || n.domain() == "ai.onnx") ||
        n.output_size() != 1)
      continue;
    for (const auto& a : n.attribute())
      if (a.name() == "value" && a.has_t()) out[n.output(0)] = &a.t();
  }
}

void check_node_attributes(const onnx::NodeProto& n, const std::string& node) {
  for (const auto& a : n.attribute()) {
    std::optional<int64_t> floor = attribute_floor(n.op_type(), a.name());
    if (!floor) continue;
    if (a.type() == onnx::AttributeProto::INT && a.i() < *floor) {
      fail(ErrorKind::kModel, "node '{}' ({}): attribute {} = {}; it must be >= {}", node,
           n.op_type(), a.name(), a.i(), *floor);
    }
    if (a.type() != onnx::AttributeProto::INTS) continue;
    for (int k = 0; k < a.ints_size(); ++k) {
      if (a.ints(k) >= *floor) continue;
      fail(ErrorKind::kModel, "node '{}' ({}): attribute {} = {}: entry {} is {}; each must be >= {}",
           node, n.op_type(), a.name(), shown(a.ints()), k, a.ints(k), *floor);
    }
  }
}

/// Slice's `steps` (input 4 from opset 10). 0 has no meaning. ONNX 1.12's data propagation
/// walks a shape tensor with a 32-bit index, `i += step`: a step past 2^31 - 1 in magnitude is
/// cut to its low 32 bits, so INT64_MIN never moves (a loop that fills memory) and -2^63 + 1
/// jumps past the end (a read out of bounds). A shape tensor is far shorter than 2^31, where
/// such a step takes one element as a step of the dim's size would.
void check_slice_steps(const onnx::NodeProto& n, const std::string& node, const Constants& known) {
  if (n.op_type() != "Slice" || n.input_size() < 5 || n.input(4).empty()) return;
  auto it = known.find(n.input(4));
  if (it == known.end()) return;
  std::optional<std::vector<int64_t>> steps = small_ints(*it->second);
  if (!steps) return;
  constexpr int64_t kMaxStep = std::numeric_limits<int32_t>::max();
  for (std::size_t k = 0; k < steps->size(); ++k) {
    int64_t step = (*steps)[k];
    if (step == 0) {
      fail(ErrorKind::kModel, "node '{}' (Slice): steps '{}' entry {} is 0; a step must not be 0",
           node, n.input(4), k);
    }
    if (step < -kMaxStep || step > kMaxStep) {
      fail(ErrorKind::kModel,
           "node '{}' (Slice): steps '{}' entry {} is {}; stagecraft takes steps within +-{} "
           "(ONNX 1.12's shape inference counts them in 32 bits; a step as large as the dim "
           "takes the same one element)",
           node, n.input(4), k, step, kMaxStep);
    }
  }
}

/// TopK's K (input 1 from opset 10) where it is a constant: one element, not negative.
void check_topk_k(const onnx::NodeProto& n, const std::string& node, const Constants& known) {
  if (n.op_type() != "TopK" || n.input_size() < 2 || n.input(1).empty()) return;
  auto it = known.find(n.input(1));
  if (it == known.end()) return;
  std::optional<std::vector<int64_t>> k = small_ints(*it->second);
  if (!k) return;
  if (k->size() != 1)
    fail(ErrorKind::kModel, "node '{}' (TopK): K '{}' has {} elements, expected one", node,
         n.input(1), k->size());
  if ((*k)[0] < 0)
    fail(ErrorKind::kModel, "node '{}' (TopK): K '{}' = {} is negative", node, n.input(1),
         (*k)[0]);
}

/// Checks the nodes of `g` and of the graphs inside them (If, Loop, Scan bodies, which ONNX's
/// inference enters too); `known` holds the constants of the enclosing graphs.
void check_graph(const onnx::GraphProto& g, Constants known) {
  add_constants(g, known);
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    for (const auto& a : n.attribute()) {
      if (a.has_g()) check_graph(a.g(), known);
      for (const auto& body : a.graphs()) check_graph(body, known);
    }
    if (!(n.domain().empty() || n.domain() == "ai.onnx")) continue;
    const std::string node = node_name_or_default(n, i);
    check_node_attributes(n, node);
    check_slice_steps(n, node, known);
    check_topk_k(n, node, known);
  }
}

}  // namespace

void check_attributes_for_inference(const onnx::ModelProto& model) {
  check_graph(model.graph(), {});
}

std::string inference_context(const onnx::ModelProto& model, const std::string& node) {
  const onnx::GraphProto& g = model.graph();
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    if (n.op_type() != "TopK" || node_name_or_default(n, i) != node) continue;
    int64_t axis = -1;
    std::optional<int64_t> k;
    for (const auto& a : n.attribute()) {
      if (a.name() == "axis") axis = a.i();
      if (a.name() == "k") k = a.i();
    }
    if (n.input_size() >= 2 && !n.input(1).empty()) {
      Constants known;
      add_constants(g, known);
      auto it = known.find(n.input(1));
      if (it != known.end())
        if (std::optional<std::vector<int64_t>> v = small_ints(*it->second); v && v->size() == 1)
          k = (*v)[0];
    }
    if (!k) return fmt::format(" (axis = {})", axis);
    return fmt::format(" (K = {}, axis = {})", *k, axis);
  }
  return "";
}

}  // namespace stagecraft::ir
