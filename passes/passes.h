#pragma once
/// \file
/// Declarations of the pass classes listed in passes.def.

#include "passes/pass.h"

namespace stagecraft::passes {

#define STAGECRAFT_PASS(cli_name, class_name, description)                   \
  class class_name final : public Pass {                                     \
   public:                                                                   \
    std::string_view name() const override { return cli_name; }              \
    bool run(ir::Graph& graph, PassContext& context) const override;         \
  };
#include "passes/passes.def"
#undef STAGECRAFT_PASS

/// Whether the `mixed-precision` pass keeps `node` in float32 whatever its schema allows (Casts
/// around it): ops of another domain (the fused Attention and Gelu among them),
/// BatchNormalization (float32 running statistics), the loss (nodes named "loss/...") and any
/// node writing a graph output.
bool needs_float32(const ir::Graph& graph, const ir::Node& node);

}  // namespace stagecraft::passes
