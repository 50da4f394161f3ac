#include "compiler/ir/ops.h"

#include "runtime/format/error.h"

namespace stagecraft {
namespace {

struct OpEntry {
  std::string_view op_type;
  OpFamily family;
};

constexpr OpEntry kOps[] = {
#define STAGECRAFT_OP(name, family) {#name, OpFamily::family},
#include "compiler/ir/ops.def"
#undef STAGECRAFT_OP
};

}  // namespace

std::optional<OpFamily> op_family(std::string_view op_type) {
  for (const auto& e : kOps) {
    if (e.op_type == op_type) return e.family;
  }
  return std::nullopt;
}

const std::vector<std::string_view>& supported_ops() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const auto& e : kOps) v.push_back(e.op_type);
    return v;
  }();
  return names;
}

void check_supported_op(std::string_view op_type, std::string_view domain,
                        std::string_view node_label, int64_t opset) {
  if (!domain.empty() && domain != "ai.onnx") {
    fail(ErrorKind::kUnsupported,
         "op {} (node '{}', domain '{}', opset {}) is not supported: stagecraft supports only the "
         "default ONNX domain",
         op_type, node_label, domain, opset);
  }
  if (!op_family(op_type)) {
    fail(ErrorKind::kUnsupported,
         "op {} (node '{}', domain ai.onnx, opset {}) is not supported; the {} supported ops are "
         "listed in compiler/ir/ops.def",
         op_type, node_label, opset, supported_ops().size());
  }
}

}  // namespace stagecraft
