#pragma once
/// \file
/// The schedule file format: the ordered instruction stream each device runs in one training or
/// inference step (schedule.json), its pipeline shape, its validation and the timeline events a
/// run of it gives. A schedule depends only on the shape of the pipeline (devices, chunks per
/// device, microbatches), never on the model. The compiler builds schedules
/// (compiler/schedule/build_schedule.h) and simulates them (compiler/schedule/simulator.h); the
/// runtime reads, validates and runs them with this header alone.
///
/// Stages are global: with P devices and V chunks per device there are S = P*V stages, and
/// stage s lives on device s % P (Megatron-LM's virtual stages, chunk c of device d is stage
/// c*P + d), except under a V placement (zb-v and dualpipev: two chunks, device d holds stages
/// d and 2P-1-d). Every instruction names a stage of the device that runs it; sends and receives
/// also name the peer stage.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/error.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::schedule {

/// One kind of instruction. Sends are asynchronous; receives wait for the data.
enum class Op {
  kRecvAct,        ///< Receive the activations of `microbatch` from `peer_stage` (= stage - 1).
  kForward,        ///< Forward of `stage` on `microbatch`.
  kSendAct,        ///< Send the forward's outputs to `peer_stage` (= stage + 1).
  kRecvGrad,       ///< Receive the gradient of the stage's outputs from `peer_stage` (= stage + 1).
  kBackward,       ///< Full backward: input and weight gradients, then the activations are freed.
  kBackwardInput,  ///< ZB's B: the gradient of the stage's inputs only (on the critical path).
  kBackwardWeight,  ///< ZB's W: the weight gradients, deferred to fill bubbles; frees activations.
  kSendGrad,        ///< Send the gradient of the stage's inputs to `peer_stage` (= stage - 1).
  /// All-reduce of the stage's gradients across data-parallel replicas. The runtime splits
  /// them into buckets (`kDefaultGradientBucketBytes`) and starts each bucket's sum as soon as
  /// the stage's last weight-gradient instruction of the step (BWD or BWD_WEIGHT) has made it
  /// final, while the device goes on; ALLREDUCE waits for them all (the simulator models the
  /// same: compiler/schedule/simulator.h).
  kAllReduce,
  /// Starts the sum of the stage's shared weights' gradients with the other stages that hold
  /// them (PipelineShape::shared_groups); takes no device time. The stage's OPT_STEP waits for
  /// the sum of every holder, so each must come after the ALLREDUCE_SHARED of every partner on
  /// the same device.
  kAllReduceShared,
  kOptimizerStep,  ///< Optimizer update of the stage's weights, once per step.
};

/// Messages a link between two stages holds before a send waits for the receiver to take the
/// oldest: 2 in training (a buffer computing and one arriving, as Megatron's fixed send and
/// receive buffers), 1 in inference. The runtime's transports, the schedule validator and the
/// simulator use this number alike, and the memory model counts what it bounds, so a link's
/// buffers never grow with the microbatch count.
inline constexpr int kTrainingLinkCapacity = 2;

/// The gradient bucket the runtime sums over data-parallel replicas at once, in bytes (stagerun
/// --bucket-mb; 25 MiB, PyTorch DDP's bucket_cap_mb): the planner predicts with it.
constexpr int64_t kDefaultGradientBucketBytes = int64_t{25} << 20;

/// One step of a device's program.
struct Instruction {
  Op op;
  int stage;            ///< Global stage (chunk) index; always a stage of the running device.
  int microbatch;       ///< 0..M-1, or -1 for the step-level ops (all-reduce, optimizer step).
  int peer_stage = -1;  ///< The other end of a send or receive; -1 for everything else.

  friend bool operator==(const Instruction&, const Instruction&) = default;
};

/// The instructions of every device, indexed by device, each list in execution order.
using Schedule = std::vector<std::vector<Instruction>>;

/// How the stages are dealt to the devices. Chunk c of a device is stage c*P + d under
/// both placements when c is 0; they differ in the second chunk's stage.
enum class Placement {
  kRoundRobin,  ///< Stage s on device s % P (every schedule but zb-v and dualpipev).
  kV,  ///< Two chunks in a V: stage s on device s for s < P, else on 2P-1-s (zb-v, dualpipev).
};

/// The shape a schedule is built for.
struct PipelineShape {
  int devices;            ///< P, the pipeline depth in devices.
  int chunks;             ///< V, stages per device; 1 unless the schedule is interleaved.
  int microbatches;       ///< M, microbatches per step.
  bool training;          ///< Training (forward, backward, optimizer) or inference (forward).
  int data_parallel = 1;  ///< Replicas of the whole pipeline; AllReduce is emitted when > 1.
  /// Sets of stages (each ascending, two or more) that hold a common weight; in training every
  /// stage in one gets an ALLREDUCE_SHARED. Empty for most models.
  std::vector<std::vector<int>> shared_groups = {};
  /// Where the stages live: placement_of(kind) of the schedule kind (check_schedule_shape
  /// refuses another).
  Placement placement = Placement::kRoundRobin;
};

/// The placement `kind` runs on: kV for zb-v and dualpipev, kRoundRobin for the others.
Placement placement_of(ScheduleKind kind);

/// The chunks per device `kind` always runs (1, or 2 for zb-v and dualpipev); 0 when it takes
/// any count (interleaved, custom).
int fixed_chunks(ScheduleKind kind);

/// The messages a link of `shape` holds: kTrainingLinkCapacity in training, 1 in inference.
int link_capacity(const PipelineShape& shape);

/// True when `stage` is in one of `shape.shared_groups`.
bool holds_shared(const PipelineShape& shape, int stage);

/// Refuses shared groups that do not fit the shape (`Error(kind)` naming the group): a stage out
/// of range, fewer than two stages, stages not ascending.
void check_shared_groups(const PipelineShape& shape, ErrorKind kind);

/// The stages that share a weight with `stage` (itself included when it shares any),
/// ascending: those whose ALLREDUCE_SHARED its OPT_STEP waits for.
std::vector<int> shared_partners(const PipelineShape& shape, int stage);

/// The schedule rules, checked once for the planner, the builders and the plan reader: throws
/// `Error(error)` naming the numbers when `kind` cannot serve `shape`: P, V, M or DP below 1,
/// V != 1 for a schedule without chunks (V != 2 for zb-v and dualpipev), a placement other than
/// placement_of(kind), M not a multiple of P for the interleaved schedule, M < 2P for
/// dualpipev, a
/// training schedule for inference or the inference schedule for training, shared groups that do
/// not fit (check_shared_groups).
void check_schedule_shape(ScheduleKind kind, const PipelineShape& shape, ErrorKind error);

/// Number of global stages, P * V.
int stage_count(const PipelineShape& shape);

/// The device that holds `stage`: stage % P when chunks are dealt round-robin; under the V
/// placement stage for stage < P, else 2P-1-stage. Needs P >= 1 and 0 <= stage < P * V. Inline:
/// the simulator asks it in its inner loops.
inline int device_of_stage(int stage, const PipelineShape& shape) {
  if (shape.placement == Placement::kV && stage >= shape.devices)
    return 2 * shape.devices - 1 - stage;
  return stage % shape.devices;
}

/// device_of_stage for a plan's numbers: `devices` (P) and its schedule kind's placement.
int device_of_stage(int stage, int devices, ScheduleKind kind);

/// The stage that is chunk `chunk` (0..V-1) of `device`: chunk * P + device round-robin; under
/// the V placement `device` for chunk 0 and 2P-1-device for chunk 1.
int stage_of_chunk(int device, int chunk, const PipelineShape& shape);

/// Checks the structure of a schedule and throws `Error(kPlan)` naming the device, the
/// position and the instruction at the first fault: one list per device; every instruction on
/// the device of its stage with valid stage, microbatch and peer; every (stage, microbatch) with
/// exactly one forward and, in training, one full backward or one B and one W, each after its
/// forward (W after B); every receive before the compute that uses it and every send after the
/// compute that produces it, each receive matched by one send; in training one optimizer step
/// per stage after all its backwards (an all-reduce, required when data_parallel > 1, between
/// them; one ALLREDUCE_SHARED between them exactly for the stages of shape.shared_groups); and
/// finally that the devices can run their lists to the end without deadlock (played in order by
/// the readiness rules of readiness.h, the same rules the simulator times).
void validate_schedule(const Schedule& schedule, const PipelineShape& shape);

/// True for the ops that move data between stages (RECV_ACT, SEND_ACT, RECV_GRAD, SEND_GRAD),
/// the only ones that name a peer stage.
constexpr bool is_transfer(Op op) {
  return op == Op::kRecvAct || op == Op::kSendAct || op == Op::kRecvGrad || op == Op::kSendGrad;
}

/// True for the ops that run once per stage and step (ALLREDUCE, ALLREDUCE_SHARED, OPT_STEP),
/// not per microbatch. Inline: the simulator asks it for every instruction of every candidate.
constexpr bool is_step_level(Op op) {
  return op == Op::kAllReduce || op == Op::kAllReduceShared || op == Op::kOptimizerStep;
}

/// The plan-file name of an op: "RECV_ACT", "FWD", "SEND_ACT", "RECV_GRAD", "BWD",
/// "BWD_INPUT", "BWD_WEIGHT", "SEND_GRAD", "ALLREDUCE", "ALLREDUCE_SHARED", "OPT_STEP".
std::string to_string(Op op);

/// The op named `name` (as `to_string(Op)` writes it); throws `Error(kFormat)` otherwise.
Op parse_op(std::string_view name);

/// One instruction for messages and listings: "FWD stage 2 mb 5", "RECV_ACT stage 2 mb 5 from
/// stage 1", "OPT_STEP stage 2".
std::string to_string(const Instruction& instruction);

/// One instruction as it ran (in the simulator's prediction or a measured run). For a send, the
/// interval is the transfer on its link; for a receive, the wait from the device being free to
/// the data's arrival.
struct TimelineEvent {
  int device;
  Op op;
  int stage;
  int microbatch;  ///< -1 for step-level ops.
  double start_s;
  double end_s;
};

/// The body of schedule.json: {"devices":[{"device":0,"instructions":[{"op":"FWD","stage":0,
/// "mb":0}, {"op":"SEND_ACT","stage":0,"mb":0,"peer":1}, ...]}]}. "mb" is left out of
/// step-level ops and "peer" out of everything but sends and receives.
nlohmann::json to_json(const Schedule& schedule);

/// Reads what `to_json` writes; throws `Error(kFormat)` naming the field that is wrong. The
/// result still needs `validate_schedule`.
Schedule schedule_from_json(const nlohmann::json& body);

}  // namespace stagecraft::schedule
