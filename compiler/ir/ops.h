#pragma once
/// \file
/// The operators stagecraft supports (listed once, in ops.def) and the import check against
/// that list.

#include <optional>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft {

/// Groups of ops that share cost formulas and kernels.
enum class OpFamily { kMatMul, kConv, kNorm, kPool, kElementwise, kReduce, kData, kShape };

/// The family of a supported default-domain op, or nullopt when the op is not supported.
std::optional<OpFamily> op_family(std::string_view op_type);

/// Every supported op type, in ops.def order.
const std::vector<std::string_view>& supported_ops();

/// Throws `Error(kUnsupported)` when an op is outside the list or its domain is not the default
/// ONNX domain, naming the op, the node (`node_label`), the domain and the domain's opset.
void check_supported_op(std::string_view op_type, std::string_view domain,
                        std::string_view node_label, int64_t opset);

}  // namespace stagecraft
