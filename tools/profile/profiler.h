#pragma once
/// \file
/// Measured profiling: times each distinct op signature of a graph with a backend's own kernels
/// and records the results in a profile database (cost_models/profile_db.h), which
/// `cost::MeasuredCostModel` then reads. This library links both the compiler's IR and the
/// runtime, so it lives with the tools; the compiler and the cost models never link the runtime.
///
/// How one signature is measured: the node is exported as a one-node ONNX model (static shapes,
/// weights embedded), its outputs made arena intermediates (so a run times the kernel, not the
/// allocation of owned output tensors), bound with `rt::Program::from_model` on the CPU
/// backend and fed deterministic inputs (floats uniform in [-1, 1), integers 0, bools false).
/// One warm-up run, then timed runs until they add up to 10 ms or 100 runs, whichever comes
/// first, and never fewer than 3; the median is recorded. Inputs stay the same between runs,
/// so the caches are as warm as they can be: the times are lower bounds for an op whose inputs
/// arrive from DRAM.
///
/// How its backward is measured (training plans): the autodiff pass itself
/// (`passes::build_backward`) writes the backward program of the node alone, seeded at every
/// floating-point output, once wanting the gradients of its activation inputs (the B part: the
/// "<node>@grad" op) and once those of its trainable weights (the W part: the "<node>@grad_w"
/// op with `weight_gradients = 1`), so the gradient ops timed are the ones a stage's backward
/// file holds. Each part is bound and timed like a forward node (its outputs arena
/// intermediates, the forward values and output gradients it reads as deterministic inputs).

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"
#include "cost_models/profile_db.h"

namespace stagecraft::profile {

/// What `profile_graph` measures.
enum class Direction {
  kForward,             ///< Forward ops only (inference plans).
  kForwardAndBackward,  ///< Also the gradient ops of every node that may have them (training
                        ///< plans).
};

/// What `profile_graph` did.
struct ProfileStats {
  int signatures = 0;  ///< Distinct signatures in the graph.
  int cached = 0;      ///< Of those, already in the database.
  int measured = 0;    ///< Of those, measured now (signatures - cached).
  /// Distinct (signature, input kinds) that may have a backward (`cost::may_have_backward`);
  /// 0 with `Direction::kForward`.
  int backward_signatures = 0;
  int backward_cached = 0;    ///< Of those, already in the database.
  int backward_measured = 0;  ///< Of those, measured now.
  /// Of those, one line each for the ones whose gradient ops the backend cannot run (the node
  /// and the reason): not recorded, so `MeasuredCostModel` takes the roofline ratio for them,
  /// and tried again the next time.
  std::vector<std::string> backward_by_ratio;
  double seconds = 0;  ///< Wall time of the whole call.
};

/// Called after each forward or backward measured: (done, to measure).
using Progress = std::function<void(int done, int total)>;

/// Measures one node of `graph` on the backend named `backend` (runtime/core/backend.h) with
/// `threads` OpenMP threads (the caller's thread count is set for the call and restored after).
/// Throws `Error(kUnsupported)` naming the node and the reason when the backend cannot run it.
cost::ProfileEntry measure_node(const ir::Graph& graph, ir::NodeId node, int threads,
                                std::string_view backend = "cpu");

/// Measures the backward of one node of `graph` (see the file comment) on the backend named
/// `backend` with `threads` OpenMP threads. A node none of whose inputs takes a gradient gets
/// an entry with no parts. Throws `Error(kUnsupported)` naming the node and the gradient op
/// when the backend cannot run a gradient op.
cost::BackwardEntry measure_backward(const ir::Graph& graph, ir::NodeId node, int threads,
                                     std::string_view backend = "cpu");

/// The stamp of the kernels this build profiles with on `backend` ("cpu", "cuda"): a hash of the
/// backend's kernel sources, the shared ops and the runtime core, made when the build was
/// configured (tools/CMakeLists.txt). A database stamped otherwise was measured with other
/// kernels (`refresh_kernels`).
std::string kernels_stamp(std::string_view backend);

/// Makes `db` this build's on its backend: a database measured with other kernels (another
/// stamp, or none: written before stamps were kept) loses its measurements, which would plan
/// with times the kernels no longer take, and returns one line saying so ("" when nothing was
/// dropped; `path` names the file in it); then `db` carries this build's stamp.
std::string refresh_kernels(cost::ProfileDb& db, const std::string& path);

/// Measures every live node of `graph` whose signature is not in `db` yet (nodes with the same
/// signature once) and adds the results to `db`; with `Direction::kForwardAndBackward` also the
/// backward of every node that may have one and whose (signature, input kinds) has no backward
/// entry yet, all on the database's backend (by name). `threads` must be the database's thread
/// count.
ProfileStats profile_graph(const ir::Graph& graph, cost::ProfileDb& db, int threads,
                           Direction direction = Direction::kForward,
                           const Progress& progress = {});

}  // namespace stagecraft::profile
