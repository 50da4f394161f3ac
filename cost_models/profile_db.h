#pragma once
/// \file
/// Measured op times: the profile database and the cost model that reads it.
///
/// The database maps an op *signature* (op type, input dtypes and shapes, output shapes, and a
/// hash of the attributes and small constant inputs) to the forward time the backend's own
/// kernels took for it and, for training plans, to the time of the gradient ops autodiff writes
/// for it. Filling it is the profiler's job (tools/profile, which links the runtime; this
/// library never does): cost_models only reads, writes and looks up entries.
///
/// File format (JSON, written atomically: a temporary file beside it, then a rename):
///
///     {"format": "stagecraft-profile", "version": 2, "backend": "cpu", "threads": 1,
///      "kernels": "3f2a9c...", "entries": {KEY: {"op": "MatMul", "fwd_ms": 0.0123, "runs": 100,
///                        "backward": {"aw": {"input_ms": 0.0131, "input_runs": 100,
///                                            "weight_ms": 0.0142, "weight_runs": 100}}}, ...}}
///
/// `backward` (optional) is keyed by the node's input kinds (`input_kinds`: the same signature
/// has another backward when other inputs are weights); `input_*` is the input-gradient part
/// (B), `weight_*` the weight-gradient part (W), each present only when autodiff writes that
/// part, so `{}` records a node whose inputs get no gradient op. Version 1 files (forward times
/// only) are still read; their backward entries are measured and added when a training plan
/// is profiled, and the file is written back as version 2.
///
/// Two optional sections (version 2 files without them are read as before):
///
///     "instruction_ms": {"FWD": 0.004, "BWD": 0.004, "SEND_ACT": 0.002, "RECV_ACT": 0.001, ...},
///     "calibration": {KEY: {"trace": "run.json", "measured_step_ms": 12.3, "steps": 9,
///                           "instruction_ms": {"FWD": 0.05, ...},
///                           "stage_factors": [{"FWD": 1.12, "BWD": 1.31}, ...],
///                           "op_factors": {"FWD": {"basis": "op type", "other": 1.2,
///                                                  "factors": {"Conv": 1.3, "Relu": 0.9}},
///                                          "OPT_STEP": {"basis": "kind", "other": 2.1,
///                                                       "factors": {}}, ...}}, ...}
///
/// `instruction_ms` is the fixed cost of an empty instruction of each kind as the runtime runs
/// it (tools/profile/instruction_costs.h); `calibration` holds what `stagec --calibrate` fitted
/// from a measured run (cost_models/calibration.h), keyed by `calibration_key` of the plan it
/// ran, which a later plan of the same model and shape looks up. `op_factors` (optional: older
/// calibrations lack it and apply by stage index) are factors that follow the ops, by op type,
/// op name or for the whole kind (`OpFactorTable`).
///
/// A file that is not JSON, has another format or version, or has a malformed entry is
/// refused with one line naming the file and the field; it is never silently replaced.

#include <cstdint>
#include <map>
#include <string>

#include "compiler/ir/graph.h"
#include "cost_models/calibration.h"
#include "cost_models/roofline.h"

namespace stagecraft::cost {

/// The measured backward of one signature with one assignment of input kinds: the gradient
/// ops autodiff writes for the node, timed as the runtime runs them. A part with 0 runs is not
/// written by autodiff for this node (no activation, or no weight, takes a gradient) and
/// costs nothing.
struct BackwardEntry {
  double input_ms = 0;      ///< Median time of the input-gradient part (B), milliseconds.
  int64_t input_runs = 0;   ///< Timed runs the B median is over; 0 when there is no B part.
  double weight_ms = 0;     ///< Median time of the weight-gradient part (W), milliseconds.
  int64_t weight_runs = 0;  ///< Timed runs the W median is over; 0 when there is no W part.
};

/// One measured signature.
struct ProfileEntry {
  std::string op;     ///< Op type, for people reading the file.
  double fwd_ms = 0;  ///< Median forward time of one run, milliseconds.
  int64_t runs = 0;   ///< Timed runs the median is over.
  /// Measured backwards by input kinds (`input_kinds`); empty until a training plan is profiled.
  std::map<std::string, BackwardEntry> backward;
};

class ProfileDb {
 public:
  /// The version `save` writes. Version 1 (no backward entries) is read as well.
  static constexpr int kVersion = 2;

  /// An empty database for `backend` measured with `threads` threads.
  explicit ProfileDb(std::string backend = "cpu", int threads = 1);

  /// Reads `path`. Throws `Error(kIo)` when it cannot be read and `Error(kFormat)` naming the
  /// file and the field when it is not a version-1 or version-2 stagecraft profile.
  static ProfileDb load(const std::string& path);

  /// `load(path)` when the file exists, else an empty database. Throws `Error(kUsage)` naming
  /// the file when it was measured on another backend or thread count than asked.
  static ProfileDb open(const std::string& path, const std::string& backend, int threads);

  /// Writes the database to `path` atomically (temporary file in the same folder, then
  /// rename), creating the folder when missing. Throws `Error(kIo)` naming the file.
  void save(const std::string& path) const;

  const std::string& backend() const { return backend_; }
  int threads() const { return threads_; }
  /// Which kernels measured it ("kernels": the profiler's stamp of the backend's kernel sources,
  /// tools/profile/profiler.h; "" in files written before it was kept).
  const std::string& kernels() const { return kernels_; }
  void set_kernels(std::string stamp) { kernels_ = std::move(stamp); }
  /// Forgets every measurement (entries, instruction costs, calibrations): they were taken with
  /// other kernels.
  void clear_measurements();
  const std::map<std::string, ProfileEntry>& entries() const { return entries_; }
  std::size_t size() const { return entries_.size(); }

  /// The entry for `key`, or null.
  const ProfileEntry* find(const std::string& key) const;
  /// Adds or replaces the entry for `key` (its backward entries included).
  void put(const std::string& key, ProfileEntry entry);
  /// The backward of `key` with input kinds `kinds`, or null.
  const BackwardEntry* find_backward(const std::string& key, const std::string& kinds) const;
  /// Adds or replaces the backward of `key` with input kinds `kinds`. Throws `Error(kInternal)`
  /// when `key` has no entry (the forward is measured first).
  void put_backward(const std::string& key, const std::string& kinds, BackwardEntry entry);

  /// Fixed costs of empty instructions by kind name, milliseconds (empty until measured).
  const std::map<std::string, double>& instruction_ms() const { return instruction_ms_; }
  void set_instruction_ms(std::map<std::string, double> ms) { instruction_ms_ = std::move(ms); }
  /// The calibration kept under `key` (`calibration_key`), or null.
  const InstructionTerms* find_calibration(const std::string& key) const;
  /// Adds or replaces the calibration under `key`.
  void put_calibration(const std::string& key, InstructionTerms terms);
  const std::map<std::string, InstructionTerms>& calibrations() const { return calibrations_; }

 private:
  std::string backend_;
  std::string kernels_;
  int threads_;
  std::map<std::string, ProfileEntry> entries_;
  std::map<std::string, double> instruction_ms_;
  std::map<std::string, InstructionTerms> calibrations_;
};

/// The signature of `node` (which belongs to `graph` and has static shapes), e.g.
/// "MatMul(float32[4,16,64],float32[64,256])->(float32[4,16,256])#8c1f...": op type (with its
/// domain when not the default), input dtypes and shapes ("-" for an omitted optional input),
/// output dtypes and shapes, and a 64-bit hash of the attributes (sorted by name) and of the
/// contents of small integer constant inputs (axes, pads, Slice bounds), which change what a
/// kernel does without always changing a shape. Two nodes with the same key do the same work;
/// weight values, tensor names and node names do not enter it.
std::string signature_key(const ir::Graph& graph, const ir::Node& node);

/// What each input of `node` is to its backward, one letter per input in order: 'a' a
/// floating-point value that is not an initializer (an activation or graph input: its gradient
/// is wanted), 'w' a trainable weight (a float32 initializer marked `is_weight`), '-' anything
/// else (an omitted input, an integer or bool value, a constant). With the signature it fixes
/// the gradient ops autodiff writes, so it keys the backward entries. Graph inputs count as
/// activations here: the same signature is one entry wherever it stands, and the cost model
/// charges no input part to a node whose activations are all graph inputs
/// (`reads_only_graph_inputs`: autodiff writes no gradient of the model's data).
std::string input_kinds(const ir::Graph& graph, const ir::Node& node);

/// Whether every input of kind 'a' of `node` (at least one) is a graph input; `kinds` is
/// `input_kinds(graph, node)`.
bool reads_only_graph_inputs(const ir::Graph& graph, const ir::Node& node,
                             const std::string& kinds);

/// Whether `node` can have a backward at all: a floating-point output and an input of kind 'a'
/// or 'w'. Other nodes (shape arithmetic, comparisons, integer ops) cost 0 backward and are not
/// measured.
bool may_have_backward(const ir::Graph& graph, const ir::Node& node);

/// Where `MeasuredCostModel` takes backward times from.
enum class BackwardTimes {
  /// Measured forward x the roofline's backward/forward ratio for the same node, split into B
  /// and W in the roofline's proportions (inference plans, databases profiled for inference).
  kRooflineRatio,
  /// The database's backward entries (measured gradient ops); the roofline ratio only for a
  /// signature without one, which the profiler leaves out, and reports, when the backend has
  /// no gradient kernel for it.
  kMeasured,
  /// None: forward times only, backward 0 (inference plans, which run no backward).
  kNone,
};

/// Op times from a profile database.
///
/// Forward is the measured median; backward as `BackwardTimes` says (with kMeasured, 0 for a
/// node that cannot have one, `may_have_backward`). A node whose signature is not in the
/// database is an `Error(kPlan)` naming the node (profile the graph first).
class MeasuredCostModel final : public OpCostModel {
 public:
  /// Copies what it needs from `db` and `roofline`: both may go away afterwards.
  MeasuredCostModel(const ProfileDb& db, const RooflineCostModel& roofline,
                    BackwardTimes backward = BackwardTimes::kRooflineRatio);

  OpTime op_time(const ir::Graph& graph, const ir::Node& node) const override;
  /// "measured(cpu, 1 thread), forward and backward" (kMeasured),
  /// "measured(cpu, 1 thread) + roofline ratios for backward" (kRooflineRatio) or
  /// "measured(cpu, 1 thread), forward" (kNone).
  std::string name() const override;

 private:
  std::map<std::string, ProfileEntry> entries_;
  std::string backend_;
  int threads_;
  BackwardTimes backward_;
  RooflineCostModel roofline_;
};

}  // namespace stagecraft::cost
