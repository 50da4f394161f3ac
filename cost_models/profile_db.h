#pragma once
/// \file
/// Measured op times: the profile database and the cost model that reads it.
///
/// The database maps an op *signature* (op type, input dtypes and shapes, output shapes, and a
/// hash of the attributes and small constant inputs) to the forward time the backend's own
/// kernels took for it. Filling it is the profiler's job (tools/profile, which links the
/// runtime; this library never does): cost_models only reads, writes and looks up entries.
///
/// File format (JSON, written atomically: a temporary file beside it, then a rename):
///
///     {"format": "stagecraft-profile", "version": 1, "backend": "cpu", "threads": 1,
///      "entries": {KEY: {"op": "MatMul", "fwd_ms": 0.0123, "runs": 100}, ...}}
///
/// A file that is not JSON, has another format or version, or has a malformed entry is
/// refused with one line naming the file and the field; it is never silently replaced.

#include <cstdint>
#include <map>
#include <string>

#include "compiler/ir/graph.h"
#include "cost_models/roofline.h"

namespace stagecraft::cost {

/// One measured signature.
struct ProfileEntry {
  std::string op;     ///< Op type, for people reading the file.
  double fwd_ms = 0;  ///< Median forward time of one run, milliseconds.
  int64_t runs = 0;   ///< Timed runs the median is over.
};

class ProfileDb {
 public:
  static constexpr int kVersion = 1;

  /// An empty database for `backend` measured with `threads` threads.
  explicit ProfileDb(std::string backend = "cpu", int threads = 1);

  /// Reads `path`. Throws `Error(kIo)` when it cannot be read and `Error(kFormat)` naming the
  /// file and the field when it is not a version-1 stagecraft profile.
  static ProfileDb load(const std::string& path);

  /// `load(path)` when the file exists, else an empty database. Throws `Error(kUsage)` naming
  /// the file when it was measured on another backend or thread count than asked.
  static ProfileDb open(const std::string& path, const std::string& backend, int threads);

  /// Writes the database to `path` atomically (temporary file in the same folder, then
  /// rename), creating the folder when missing. Throws `Error(kIo)` naming the file.
  void save(const std::string& path) const;

  const std::string& backend() const { return backend_; }
  int threads() const { return threads_; }
  const std::map<std::string, ProfileEntry>& entries() const { return entries_; }
  std::size_t size() const { return entries_.size(); }

  /// The entry for `key`, or null.
  const ProfileEntry* find(const std::string& key) const;
  /// Adds or replaces the entry for `key`.
  void put(const std::string& key, ProfileEntry entry);

 private:
  std::string backend_;
  int threads_;
  std::map<std::string, ProfileEntry> entries_;
};

/// The signature of `node` (which belongs to `graph` and has static shapes), e.g.
/// "MatMul(float32[4,16,64],float32[64,256])->(float32[4,16,256])#8c1f...": op type (with its
/// domain when not the default), input dtypes and shapes ("-" for an omitted optional input),
/// output dtypes and shapes, and a 64-bit hash of the attributes (sorted by name) and of the
/// contents of small integer constant inputs (axes, pads, Slice bounds), which change what a
/// kernel does without always changing a shape. Two nodes with the same key do the same work;
/// weight values, tensor names and node names do not enter it.
std::string signature_key(const ir::Graph& graph, const ir::Node& node);

/// Op times from a profile database.
///
/// Forward is the measured median. The backend has no backward kernels yet (the CPU runtime
/// runs inference plans only), so backward is *estimated*: the measured forward times the
/// roofline's backward/forward ratio for the same node, split into backward_input (B) and
/// backward_weight (W) in the roofline's proportions. A node whose signature is not in the
/// database is a `Error(kPlan)` naming the node (profile the graph first).
class MeasuredCostModel final : public OpCostModel {
 public:
  /// Copies what it needs from `db` and `roofline`: both may go away afterwards.
  MeasuredCostModel(const ProfileDb& db, const RooflineCostModel& roofline);

  OpTime op_time(const ir::Graph& graph, const ir::Node& node) const override;
  /// "measured(cpu, 1 thread) + roofline ratios for backward".
  std::string name() const override;

 private:
  std::map<std::string, double> forward_s_;
  std::string backend_;
  int threads_;
  RooflineCostModel roofline_;
};

}  // namespace stagecraft::cost
