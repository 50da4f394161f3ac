#pragma once
/// \file
/// The one derivation of a program's arena lifetimes and of its weight-gradient (W) part, on
/// the values and nodes a stage file lists (no IR): the compiler sizes arenas and the B-to-W
/// memory from it when it writes the files, and the runtime places tensors and splits a
/// backward by it when it loads them, so both always agree.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/format/memory_plan.h"

namespace stagecraft::plan {

/// One node of a program in file order, as the rules below see it.
struct ProgramNode {
  std::string op_type;
  std::vector<int> inputs;        ///< Value indices read; -1 for an omitted optional input.
  std::vector<int> outputs;       ///< Value indices written; -1 for an omitted optional output.
  bool weight_gradients = false;  ///< Marked `weight_gradients` = 1 (runtime/format/grad_ops.h).
};

/// A program's nodes over values numbered 0..values-1 (inputs, weights and node outputs alike).
struct ProgramGraph {
  int values = 0;
  std::vector<ProgramNode> nodes;
};

/// The intermediates of a program and how long each lives: every node output that is not a
/// graph output (`is_output`, per value), alive from its node to its last reader, inclusive.
///
/// A view (`is_view_node`: Reshape, Flatten, Squeeze, Unsqueeze, Identity and their gradients)
/// whose source is itself an intermediate of the same bytes shares the source's bytes: its
/// entry has 0 bytes and `alias` names the entry that holds them (the first of a chain), whose
/// lifetime reaches the view's last reader. The runtime gives such a view the source's bytes
/// and does not run its node (program.cpp), so the copy is never made.
struct Intermediates {
  std::vector<int> values;          ///< Value index of each intermediate, in production order.
  std::vector<Lifetime> lifetimes;  ///< One per entry of `values`, sized by `bytes`.
  std::vector<int> alias;           ///< Per entry: the entry whose bytes it shares, or -1.
};

/// Whether `node` is a view whose output 0 may share its source's bytes, and which input is
/// the source (`*source`, a position in node.inputs): input 0 of a forward view, dY (the last
/// input) of a view's gradient.
bool is_view_node(const ProgramNode& node, std::size_t* source);

/// The arena lifetimes of `graph`'s intermediates; `bytes` and `is_output` are per value.
Intermediates intermediate_lifetimes(const ProgramGraph& graph, const std::vector<int64_t>& bytes,
                                     const std::vector<bool>& is_output);

/// Per node, whether it belongs to a backward program's weight-gradient part (W): nodes marked
/// `weight_gradients` and the Adds that only sum W results (values no node produces, such as
/// received gradients, are neutral). All false when a node outside W reads a W result (W
/// cannot be deferred then).
std::vector<bool> weight_gradient_nodes(const ProgramGraph& graph);

/// Per value, whether it crosses from the nodes where `part` is true to the others: produced
/// by a node of `part` and read by a node outside it.
std::vector<bool> crossing_values(const ProgramGraph& graph, const std::vector<bool>& part);

/// Bytes a split backward (zero-bubble B then W) holds from B to W: the values B produces that
/// W reads (`bytes` per value); 0 when W cannot be split off.
int64_t deferred_bytes(const ProgramGraph& graph, const std::vector<int64_t>& bytes);

}  // namespace stagecraft::plan
