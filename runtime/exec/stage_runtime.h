#pragma once
/// \file
/// `StageRuntime`: one stage as a loaded pipeline holds it (runtime/exec/pipeline.h): its
/// programs, weights and optimizer state, where it sends, and its place in the replicas'
/// gradient sum. pipeline.cpp loads it; the worker of its device (device_worker.h) runs it.
/// Internal to runtime/exec.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/program.h"
#include "runtime/core/tensor.h"
#include "runtime/format/plan.h"
#include "runtime/optim/optimizer.h"

namespace stagecraft::rt {

/// One stage as the runtime holds it.
struct StageRuntime {
  const plan::Stage* stage = nullptr;
  int replica = 0;  ///< The data-parallel replica whose copy of the stage this is.
  Program program;
  std::vector<int> producers;                ///< Stages this one receives from, ascending.
  std::map<int, std::vector<size_t>> sends;  ///< Consumer stage -> indices into program outputs.
  std::vector<size_t> graph_outputs;         ///< Indices into program outputs.
  // Training.
  std::optional<Program> backward;        ///< The stage's backward program.
  std::vector<bool> weight_part;          ///< Per backward node: part of W (zero-bubble).
  std::map<std::string, Tensor> weights;  ///< The forward program's weights (shared bytes).
  std::string loss;                       ///< The loss output's name when this stage computes it.
  /// What a training forward keeps for the backward, by name: the backward's inputs whose
  /// bytes it reads (Program::inputs_read) and the loss. The backward gets the others bare.
  std::set<std::string> stash;
  /// Of `stash`: the forward's Casts of weights and constants (Program::weight_casts, mixed
  /// precision's 16-bit copies), which a training step keeps once for all its microbatches.
  std::set<std::string> step_copies;
  std::map<std::string, optim::OptimizerState>
      opt_state;  ///< Per weight; only its device's worker. ZeRO-1: see `shard_lo`.
  /// Training: a trained weight's place in the stage's gradient bucket (ALLREDUCE).
  struct FlatWeight {
    std::string name;
    int64_t offset = 0, elements = 0;
  };
  /// The trained weights (whose gradient the backward outputs) one after another as the bucket
  /// holds them: in name order; with ZeRO-1 those no other stage holds first (the sharded
  /// parameters), then the shared ones (summed whole).
  std::vector<FlatWeight> flat;
  int64_t flat_elements = 0;
  /// ZeRO-1 (plan.json `shard_optimizer`): the bucket's first `sharded` elements are split at
  /// `shard_bounds` (the plan's `optimizer_shards`); this replica keeps the optimizer state of
  /// elements [shard_lo, shard_hi) only: `opt_state` of a sharded weight then holds 1-D tensors
  /// of the part of it in that range (none when it has no part there). Empty bounds: unsharded.
  std::vector<int64_t> shard_bounds;
  int64_t sharded = 0, shard_lo = 0, shard_hi = 0;
  /// The flat entry of `weight`, or null when the stage does not train it.
  const FlatWeight* flat_weight(const std::string& weight) const;
  /// With ZeRO-1, whether `weight` is sharded (not a shared weight); and the part of it in
  /// this replica's shard, as [lo, hi) offsets into the weight (lo == hi: none).
  bool is_sharded(const FlatWeight& w) const { return !shard_bounds.empty() && w.offset < sharded; }
  std::pair<int64_t, int64_t> own_part(const FlatWeight& w) const {
    const int64_t lo = std::max(w.offset, shard_lo), hi = std::min(w.offset + w.elements, shard_hi);
    return lo < hi ? std::pair{lo - w.offset, hi - w.offset} : std::pair<int64_t, int64_t>{0, 0};
  }
  // A device whose memory is not the host's (CUDA) runs with its own copies of the weights and
  // optimizer state: `weights` and `opt_state` are then those copies, and the host tensors wait
  // here. The copies stay on the device from one run to the next (a training loop of one run
  // per step moves no weights), and the host gets the device's values back before every
  // checkpoint and whenever the pipeline's accessors are asked for them between runs
  // (`Pipeline::sync_host`, which also hands the weights back to the host: they may be written
  // then, and the next run uploads them again). The pipeline's accessors give the host ones.
  bool on_device = false;
  /// On the device: a training step changed its copies since the host last got them, which
  /// was after optimizer step `host_step`.
  bool host_stale = false;
  int64_t host_step = 0;
  std::map<std::string, Tensor> host_weights;
  std::map<std::string, optim::OptimizerState> host_opt_state;
  std::map<std::string, Tensor> host_backward_weights;
};

/// The stage's weights and optimizer state copied to `device` (`on_device`), its programs bound
/// to the copies, the host's kept in `host_*`; `step`: the optimizer steps done.
void upload_stage(DeviceContext& device, StageRuntime& st, int64_t step);
/// The device's values of the stage's weights and optimizer state into the host's copies (the
/// program's own bytes, updated in place), as of optimizer step `step`. Nothing when not on it.
void download_stage(DeviceContext& device, StageRuntime& st, int64_t step);
/// The programs bound to the host's copies again, the device's dropped (`on_device` cleared).
void release_stage(StageRuntime& st);

/// What a device keeps from one run to the next (Pipeline holds one per device it runs): its
/// context (streams, library handles, caches, the CPU's buffer pool) and its arena, so a run
/// neither makes them again nor faults fresh memory in. Taken by the run's worker for the run
/// and given back at its end; a failed run drops them (the device's state is then unknown).
struct ResidentDevice {
  std::unique_ptr<DeviceContext> context;
  std::unique_ptr<Buffer> arena;
};

}  // namespace stagecraft::rt
