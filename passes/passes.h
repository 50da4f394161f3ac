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

/// Per node of `graph` (by id), per input: whether the `mixed-precision` pass computing in
/// `sixteen_bit` makes the node read that input, a float32 weight, through a 16-bit Cast (the
/// weight's 16-bit copy, which a training forward keeps with each microbatch's values). Runs the
/// pass over a copy of the graph (weights' bytes shared, not copied). Planning reads it to count
/// the copies before the split is chosen.
std::vector<std::vector<bool>> sixteen_bit_weight_reads(const ir::Graph& graph, DType sixteen_bit);

}  // namespace stagecraft::passes
