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

}  // namespace stagecraft::passes
