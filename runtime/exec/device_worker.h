#pragma once
/// \file
/// What one device does in a run: a `DeviceWorker` with one method per schedule instruction,
/// working through its device context (runtime/core/device.h) for every byte it allocates,
/// moves or changes. The workers of one run share a `RunState` (run_state.h); the stages they
/// run are the pipeline's `StageRuntime`s (stage_runtime.h). Internal to runtime/exec
/// (pipeline.cpp loads, pipeline_run.cpp runs, device_worker.cpp and optimizer_step.cpp are
/// the worker).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/program.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/run_state.h"
#include "runtime/exec/stage_runtime.h"
#include "runtime/exec/transport.h"
#include "runtime/format/schedule.h"

namespace stagecraft::rt {

/// One device's worker for one run: its context, arena and the tensors in flight.
class DeviceWorker {
 public:
  DeviceWorker(int device, RunState& run);

  /// Runs every step of the device's instruction stream; the first error stops all workers
  /// (`RunState::stop_all`), never a hang.
  void run();

  void recv_act(const schedule::Instruction& ins);
  void forward(const schedule::Instruction& ins);
  void send_act(const schedule::Instruction& ins);
  void recv_grad(const schedule::Instruction& ins);
  /// Full backward: weight gradients summed, input gradients kept for send_grad, stash freed.
  void backward(const schedule::Instruction& ins);
  /// Zero-bubble B: input gradients only; what W reads is kept.
  void backward_input(const schedule::Instruction& ins);
  /// Zero-bubble W: the weight gradients; frees the microbatch's values.
  void backward_weight(const schedule::Instruction& ins);
  void send_grad(const schedule::Instruction& ins);
  /// Data parallelism: waits for the sums of the stage's gradient buckets over the replicas
  /// (starting those not started yet); its time is the wait, not the sums behind compute.
  void allreduce(const schedule::Instruction& ins);
  void allreduce_shared(const schedule::Instruction& ins);
  /// OPT_STEP: the shared weights' sums finished, then the stage's update; with dynamic loss
  /// scaling the gradients are unscaled and checked here, with clipping their squares counted,
  /// and the update waits for the step's end (`finish_deferred_step`).
  void optimizer_step(const schedule::Instruction& ins);

 private:
  using Key = std::pair<int, int>;  ///< (stage, microbatch)
  /// A recomputing stage's microbatch in flight: the forward's arguments (its inputs) and the
  /// metered bytes of them (the received ones) and of the rebuilt stash.
  struct Recompute {
    std::vector<Tensor> args;
    int64_t input_bytes = 0, stash_bytes = 0;
  };

  /// The device's context and arena (the pipeline's from its last run, else new ones), and on
  /// a device whose memory is not the host's the stages' weights and optimizer state copied to
  /// it where they are not yet (`upload_stage`; they stay there from run to run).
  void setup();
  /// The device's values of its stages into the host's copies (`download_stage`), as of
  /// optimizer step `step`: before a checkpoint, and after a failed run.
  void download(int64_t step);
  /// The run's end: the context and arena back to the pipeline for its next run; after a
  /// failure dropped, with the stages' values downloaded as the failure left them and the
  /// host's bound again.
  void end_run();
  /// The pipeline's kept state of this device.
  ResidentDevice& resident() const { return *run_.pipeline.resident[static_cast<size_t>(device_)]; }
  /// Waits for every device at the step barrier; an error (another rank that never arrives)
  /// names the step and `when`.
  void wait_for_all(const char* when);
  void execute(const schedule::Instruction& ins);
  void run_step();
  /// The step's end: every device waits for the others, the loss scale moves on, a checkpoint
  /// is saved where one is due. Returns whether the run goes on: false once every process
  /// agreed on a stop (RunState::stop_signal), whose checkpoint was then saved.
  bool after_step();
  /// Whether this step's events and memory samples are kept (RunOptions::trace_steps).
  bool tracing() const { return step_ < run_.options.trace_steps; }
  /// The three backward kinds share this: rebuild (recompute), run, sum or keep the results.
  void run_backward(const schedule::Instruction& ins);
  void rebuild_stash(const schedule::Instruction& ins, StageRuntime& st);
  std::vector<Tensor> backward_args(const schedule::Instruction& ins, const StageRuntime& st);
  void take_backward_outputs(const schedule::Instruction& ins, StageRuntime& st,
                             std::vector<Tensor>& outs);
  void free_microbatch(const Key& key, const StageRuntime& st);
  int64_t held_output_bytes(const StageRuntime& st, const Key& key,
                            const std::vector<Tensor>& outs) const;
  /// A training forward of `ins`'s microbatch as its program sees it: the step's and
  /// microbatch's random key, and whether it updates the running statistics (the microbatch's
  /// forward does, its recomputation does not).
  TrainingRun program_run(const schedule::Instruction& ins, bool update_state) const {
    return {update_state, Program::random_key(run_.global_step + step_ + 1,
                                              static_cast<int64_t>(batch_index(ins.microbatch)))};
  }
  void record_loss(const schedule::Instruction& ins, float loss);
  /// The index of the stage's loss among its forward program's outputs.
  static size_t loss_output(const StageRuntime& st);
  /// Whether a forward keeps values for a backward: training, but not an evaluation
  /// (RunOptions::forward_only).
  bool keeps_for_backward() const { return run_.training && !run_.options.forward_only; }
  void timed(schedule::Op op, int stage, int microbatch, double start);
  /// A receive's wait, from `start` to its data in hand, or a send, from `start` to the tensors
  /// handed to the transport: on the timeline (stagerun --trace), not in the busy time.
  void waited(const schedule::Instruction& ins, double start);
  /// The device's metered bytes now, on its memory track (stagerun --trace).
  void sample_memory();

  /// Data parallelism: a stage's gradients are summed over the replicas in buckets, ranges of
  /// its flat gradient (`StageRuntime::flat`, whole weights, at most RunOptions::bucket_bytes
  /// unless one weight is larger; ZeRO-1's sharded and shared parts apart), numbered from the
  /// end of the flat layout, where the backward (which runs the layers in reverse) finishes
  /// first. Each bucket's sum is started as soon as its weights' gradients are final: during
  /// the stage's last weight-gradient instruction of the step (BWD, or W), by the program's
  /// `NodeHook::output_ready` right after the node that computes the gradient; any bucket not
  /// complete by the end of it (a gradient the program passes through) right after it. The
  /// sums then advance between the device's kernels (`progress_sums`) and instructions, and
  /// ALLREDUCE waits for them.
  struct GradBucket {
    int64_t lo = 0, hi = 0;        ///< Elements [lo, hi) of the stage's flat bucket.
    size_t first = 0, last = 0;    ///< Its weights, `flat[first, last)`.
    bool sharded = false;          ///< ZeRO-1: reduce-scattered at `bounds`; else all-reduced.
    std::vector<int64_t> bounds;   ///< Sharded: the plan's shards within it (R + 1, from 0).
    size_t waiting = 0;            ///< This step: its weights whose gradient is not final yet.
    bool started = false;          ///< This step: its sum is started.
  };
  struct StageBuckets {
    std::vector<GradBucket> buckets;
    std::map<std::string, size_t> bucket_of;  ///< Trained weight -> its bucket.
    /// Index in the device's list of the stage's last BWD or BWD_WEIGHT of a step.
    size_t last_weight_gradient = 0;
    /// Weights whose final gradient the running backward has already added up (output_ready).
    std::vector<std::string> taken;
  };
  /// The buckets of the device's stages (with data parallelism in training).
  void plan_buckets();
  /// Starts bucket `b` of the stage: its gradients copied into the flat bucket, its sum begun.
  void start_bucket(int stage_index, size_t b);
  /// The final gradient `value` of `weight` (output_ready of the last weight-gradient
  /// backward): added up, and its bucket started when it was the last one missing.
  void gradient_final(int stage_index, const std::string& weight, const Tensor& value);
  /// Lets the transport advance the sums in flight (between kernels and instructions).
  void progress_sums();
  /// The stage's flat bucket, allocated (and metered) on first use.
  Tensor& flat_bucket(int stage_index);
  /// The stage's accumulated gradient of `weight`, allocated as zeros on first use.
  Tensor& gradient_of(int stage_index, const std::string& weight);
  std::map<int, StageBuckets> grad_buckets_;
  int sums_in_flight_ = 0;  ///< Buckets started and not yet waited for.
  size_t index_ = 0;        ///< The running instruction's index in the device's list.
  /// The NVTX range name of each instruction of the device's list (CUDA; run_step).
  std::vector<std::string> range_names_;
  /// The profiled step (RunOptions::profile_step): `hook_.timed` adds each node's time to its
  /// entry of run_.node_profile[device_], found here by (stage, instruction kind, node).
  void profile_node(std::string_view node, std::string_view op_type, double ms,
                    const NodeWork& work, std::string_view note);
  std::map<std::tuple<int, std::string, std::string>, size_t, std::less<>> profile_index_;
  /// What every program run of this worker is given: the run's hook (tracing, fault
  /// injection), and the sums' progress between nodes.
  NodeHook hook_;
  Transport& transport() const { return *run_.transports[static_cast<size_t>(replica_)]; }
  /// Microbatch `mb` of this replica as the run's per-microbatch vectors index it.
  size_t batch_index(int mb) const {
    return static_cast<size_t>(replica_ * run_.microbatches + mb);
  }
  /// The run's inputs this worker's stages read, its microbatches' rows of each, page-locked
  /// for the run (DeviceContext::pin_host; each feed then copies with no wait for the device,
  /// `forward`), and let go at its end, once the device is done with them.
  void pin_feeds();
  void unpin_feeds();
  std::vector<const void*> pinned_;

  const int device_;           ///< Of all R x P.
  const int replica_;          ///< device_ / P.
  const int pipeline_device_;  ///< device_ % P: whose instruction list and stages it runs.
  RunState& run_;
  /// This replica's stage `index`.
  StageRuntime& stage(int index) const {
    return *run_.pipeline.stages[static_cast<size_t>(replica_) * run_.pipeline.plan.stages.size() +
                                 static_cast<size_t>(index)];
  }
  /// This device's stages (of its replica), in stage order.
  std::vector<StageRuntime*> own_stages() const;
  int step_ = 0;
  std::string where_;
  std::unique_ptr<DeviceContext> context_;
  std::unique_ptr<Buffer> arena_;
  // Per (stage, microbatch): received tensors waiting for FWD, outputs waiting for SEND.
  std::map<Key, std::vector<NamedTensor>> received_;
  std::map<Key, std::vector<Tensor>> produced_;
  // Training: forward values per microbatch until its backward, the backward's own values (B
  // kept for W), received output gradients, input gradients waiting to be sent, weight
  // gradients summed over the step (per stage).
  std::map<Key, std::map<std::string, Tensor>> stash_, bwd_kept_;
  /// Per stage: mixed precision's 16-bit weight copies (StageRuntime::step_copies) as the
  /// step's first forward kept them. Every later microbatch of the step keeps these instead of
  /// its own (the same bytes: the weights change only at the optimizer step), so a stage holds
  /// one copy, not one per microbatch in flight; metered once, dropped after the step's last
  /// instruction.
  std::map<int, std::map<std::string, Tensor>> step_copies_;
  void share_step_copies(int stage_index, const StageRuntime& st,
                         std::map<std::string, Tensor>& keep);
  void drop_step_copies();
  /// Bytes of a microbatch's kept values, less the weights and the step's shared copies.
  static int64_t kept_bytes(const StageRuntime& st, const std::map<std::string, Tensor>& values);
  std::map<Key, Recompute> recompute_;
  std::map<Key, std::vector<NamedTensor>> grads_in_, grads_out_;
  std::map<int, std::map<std::string, Tensor>> grad_acc_;
  /// Per stage: its weight gradients in one float32 vector (the flat layout), for the
  /// replicas' sum, bucket by bucket.
  std::map<int, Tensor> buckets_;
  /// ZeRO-1 (OPT_STEP): this replica's shard of the stage's weights updated from its shard of
  /// the summed gradients, then the other replicas' shards all-gathered into the weights.
  void sharded_step(int stage_index, float lr, int64_t update);
  /// The stage's optimizer update from its gradients (summed, unscaled), which it zeroes.
  void update_stage(int stage_index);
  /// The stage's gradients that its update reads (this replica's shard of them with ZeRO-1)
  /// multiplied by `factor` (dynamic loss scaling's 1 / S, clipping's coefficient); false when
  /// one is inf or NaN.
  bool scale_gradients(int stage_index, float factor);
  /// Gradient clipping, at OPT_STEP (after the replicas' and the holders' sums, and the
  /// unscale): the sum of the squares of the stage's gradients that this device counts for
  /// the global norm, each weight once (a shared weight at its first holder, a replicated
  /// gradient at replica 0, ZeRO-1's shards at their owners), added to its entry of
  /// `RunState::grad_squares` (grad_clip.cpp).
  void count_gradient_squares(int stage_index);
  /// Gradient clipping, at the step's end: the deferred stages' gradients multiplied by
  /// min(1, C / (norm + 1e-6)), every device and replica with the same norm (grad_clip.cpp).
  void clip_gradients();
  /// After every device's last instruction of the step, when the updates wait for it
  /// (`RunState::defers_update`): gradients clipped, the stages whose OPT_STEP ran
  /// (`deferred_`) updated, or, where any stage of any replica overflowed (dynamic loss
  /// scaling), their gradients dropped; the first device records the norm and moves the scale
  /// on.
  void finish_deferred_step();
  std::vector<int> deferred_;
  /// The optimizer update's time from `start`: an OPT_STEP event, or, for an update deferred
  /// to the step's end (`updating_deferred_`), busy time only (its OPT_STEP has its event).
  void update_timed(int stage_index, double start);
  bool updating_deferred_ = false;
};

}  // namespace stagecraft::rt
