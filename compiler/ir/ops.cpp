#include "compiler/ir/ops.h"

#include <algorithm>
#include <iterator>

#include "runtime/format/error.h"

namespace stagecraft {
namespace {

// The vocabulary of ops.def's columns.
constexpr InputMask kAllInputs = ~InputMask{0};
constexpr InputMask kNoGradient = 0;
template <class... K>
constexpr InputMask inputs(K... k) {
  return ((InputMask{1} << k) | ...);
}
constexpr FlopRule kNoFlops{FlopKind::kNone, 0};
constexpr FlopRule kMatMulFlops{FlopKind::kMatMul, 0};
constexpr FlopRule kConvFlops{FlopKind::kConv, 0};
constexpr FlopRule kConvTransposeFlops{FlopKind::kConvTranspose, 0};
constexpr FlopRule kRecurrentFlops{FlopKind::kRecurrent, 0};
constexpr FlopRule kAttentionFlops{FlopKind::kAttention, 0};
constexpr FlopRule kPoolFlops{FlopKind::kPool, 0};
constexpr FlopRule per_output(double n) { return {FlopKind::kPerOutput, n}; }
constexpr FlopRule per_input(double n) { return {FlopKind::kPerInput, n}; }

constexpr OpInfo kOps[] = {
#define STAGECRAFT_OP(name, family, differentiable, flops, flags) \
  {#name, OpFamily::family, differentiable, flops, flags, true},
#define STAGECRAFT_FOLD_ONLY_OP(name) \
  {#name, OpFamily::kData, kNoGradient, kNoFlops, kHostFolds, false},
#include "compiler/ir/ops.def"
#undef STAGECRAFT_FOLD_ONLY_OP
#undef STAGECRAFT_OP
};

}  // namespace

const OpInfo* op_info(std::string_view op_type) {
  for (const auto& e : kOps) {
    if (e.op_type == op_type) return &e;
  }
  return nullptr;
}

std::optional<OpFamily> op_family(std::string_view op_type) {
  const OpInfo* info = op_info(op_type);
  if (info == nullptr || !info->supported) return std::nullopt;
  return info->family;
}

std::span<const OpInfo> op_table() { return kOps; }

const std::vector<std::string_view>& supported_ops() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> v;
    for (const auto& e : kOps) {
      if (e.supported) v.push_back(e.op_type);
    }
    return v;
  }();
  return names;
}

namespace {

/// "input 'a'" or "inputs 'a', 'b'" for the named ones of `inputs`; "its inputs" when none is.
std::string quoted_inputs(std::span<const std::string> inputs) {
  std::string list;
  int named = 0;
  for (const std::string& name : inputs) {
    if (name.empty()) continue;
    list += (named++ == 0 ? "'" : ", '") + name + "'";
  }
  if (named == 0) return "its inputs";
  return (named == 1 ? "input " : "inputs ") + list;
}

}  // namespace

void check_supported_op(std::string_view op_type, std::string_view domain,
                        std::string_view node_label, int64_t opset,
                        std::span<const std::string> inputs) {
  if (!domain.empty() && domain != "ai.onnx") {
    fail(ErrorKind::kUnsupported,
         "op {} (node '{}', domain '{}', opset {}) is not supported: stagecraft supports only the "
         "default ONNX domain",
         op_type, node_label, domain, opset);
  }
  // Ops whose output shape follows the data (detection post-processing, control flow): a
  // static plan sizes every tensor before anything runs, so these are out of scope (issue 15).
  static constexpr std::string_view kDataDependent[] = {
      "NonZero", "NonMaxSuppression", "Unique", "Compress", "If", "Loop", "Scan"};
  if (!op_family(op_type) &&
      std::find(std::begin(kDataDependent), std::end(kDataDependent), op_type) !=
          std::end(kDataDependent)) {
    fail(ErrorKind::kUnsupported,
         "op {} (node '{}', domain ai.onnx, opset {}) is not supported: its output's shape can "
         "depend on the values of {} (data-dependent shapes: NonZero, NonMaxSuppression, "
         "Unique, Compress, If, Loop, Scan), which a static pipeline plan cannot size; export the "
         "model without that part (a detection model: its backbone and heads, without the box "
         "post-processing)",
         op_type, node_label, opset, quoted_inputs(inputs));
  }
  if (!op_family(op_type)) {
    fail(ErrorKind::kUnsupported,
         "op {} (node '{}', domain ai.onnx, opset {}) is not supported; the {} supported ops are "
         "listed in compiler/ir/ops.def",
         op_type, node_label, opset, supported_ops().size());
  }
}

}  // namespace stagecraft
