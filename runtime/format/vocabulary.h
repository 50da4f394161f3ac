#pragma once
/// \file
/// The plan's vocabulary: one enum and one name table for each choice a plan records (schedule
/// kind, optimizer, precision, objective, recompute, learning-rate scaling, device kind). The compiler parses
/// the command line with these, the plan writer writes their names and the runtime reads them back;
/// nothing else spells the names. Every `parse_*` (the command line's) ignores case (`1F1B`,
/// `GPipe`) and throws `Error(kUsage)` naming the bad value, the closest valid name when one is
/// close, and the valid names ("unknown schedule 'zbh1' (did you mean 'zb-h1'?); valid: gpipe,
/// 1f1b, interleaved, zb-h1, zb-v, dualpipev, inference"); every `find_*` (plan.json's, which we
/// write ourselves) takes the exact lower-case name and returns nullopt otherwise.

#include <optional>
#include <string_view>
#include <vector>

namespace stagecraft {

/// The order in which the devices run the forwards and backwards of their microbatches.
enum class ScheduleKind {
  kGPipe,        ///< "gpipe": all forwards, then all backwards (Huang et al. 2019).
  k1F1B,         ///< "1f1b": PipeDream-Flush / Megatron-LM one-forward-one-backward.
  kInterleaved,  ///< "interleaved": Megatron-LM interleaved 1F1B, V chunks per device.
  kZBH1,         ///< "zb-h1": ZB-H1 of "Zero Bubble Pipeline Parallelism" (Qi et al. 2023).
  /// "zb-v": ZB-V of "Pipeline Parallelism with Controllable Memory" (Qi et al. 2024), as
  /// torch.distributed.pipelining's ScheduleZBVZeroBubble orders it: two chunks per device in
  /// a V (device i holds stages i and 2P-1-i), backwards split into B and W.
  kZBV,
  /// "dualpipev": DeepSeek's DualPipeV, the "cut-in-half" DualPipe (DeepSeek-V3 report,
  /// github.com/deepseek-ai/DualPipe), as torch.distributed.pipelining's ScheduleDualPipeV
  /// orders it: zb-v's V placement, M >= 2P, a forward of one chunk paired with the full
  /// backward of the other in the steady state, B and W split around it.
  kDualPipeV,
  kInference,    ///< "inference": forwards only, pipelined over the microbatches.
  /// "custom": an order of forwards and backwards given by the user (stagec --schedule-csv, in
  /// torch.distributed.pipelining's CSV), with any chunk count; schedule.json holds it.
  kCustom,
};

/// The optimizer that updates the weights (and whose states live next to them).
enum class OptimizerKind {
  kNone,      ///< "none": inference; no gradients, no states.
  kSgd,       ///< "sgd": plain SGD, no state.
  kMomentum,  ///< "momentum": SGD with momentum, one fp32 buffer.
  kNesterov,  ///< "nesterov": SGD with Nesterov momentum, one fp32 buffer.
  kAdam,      ///< "adam": two fp32 moments.
  kAdamW,     ///< "adamw": Adam with decoupled weight decay, two fp32 moments.
  kAdam8bit,  ///< "adam8bit": 8-bit Adam (bitsandbytes), two 8-bit moments; planning only.
  kAdagrad,   ///< "adagrad": one fp32 sum of squared gradients.
};

/// How tensors are stored and multiplied.
enum class Precision {
  kFp32,   ///< "fp32": everything in fp32.
  kMixed,  ///< "mixed": bfloat16 activations and matrix products; fp32 master weights,
           ///< gradients and optimizer states when training.
  kFp16,   ///< "fp16": as "mixed" in float16, training with dynamic loss scaling (the loss's
           ///< gradient seed times a scale that halves on an overflow, whose step is skipped).
};

/// Whether `precision` computes in 16 bits (bfloat16 or float16) with fp32 masters.
constexpr bool is_16bit(Precision precision) { return precision != Precision::kFp32; }

/// What the partitioner minimises.
enum class Objective {
  kSpeed,   ///< "speed": the slowest stage's time (compute + sends), then the peak memory.
  kMemory,  ///< "memory": the largest stage's memory, then the slowest stage's time.
};

/// Activation recomputation when training.
enum class Recompute {
  kNone,  ///< "none": every stage keeps its activations for the backward.
  kAll,   ///< "all": every stage keeps only its inputs and re-runs its forward.
  kAuto,  ///< "auto": the planner chooses the stages (see compiler/plan/planner.h).
};

/// How a data-parallel plan scales the learning rate with its replica count R (the global
/// batch grows R times; Goyal et al. 2017 scale linearly, Krizhevsky 2014 by the square root).
enum class LrScaling {
  kNone,    ///< "none": the rate as given.
  kLinear,  ///< "linear": the rate times R.
  kSqrt,    ///< "sqrt": the rate times sqrt(R).
};

/// The kind of device a plan is costed for and a backend runs on: plans and device specs
/// ("kind"), backends (`Backend::kind()`: the CPU backend's devices are cpu, CUDA's gpu).
enum class DeviceKind {
  kCpu,  ///< "cpu": the CPU backend's devices.
  kGpu,  ///< "gpu": CUDA GPUs.
};

/// The name of each value, as plans and command lines spell it.
std::string_view to_string(ScheduleKind kind);
std::string_view to_string(OptimizerKind kind);
std::string_view to_string(Precision precision);
std::string_view to_string(Objective objective);
std::string_view to_string(Recompute recompute);
std::string_view to_string(LrScaling scaling);
std::string_view to_string(DeviceKind kind);

/// Every valid name of each enum, in declaration order (for usage text and checks).
const std::vector<std::string_view>& schedule_names();
const std::vector<std::string_view>& optimizer_names();
const std::vector<std::string_view>& precision_names();
const std::vector<std::string_view>& objective_names();
const std::vector<std::string_view>& recompute_names();
const std::vector<std::string_view>& lr_scaling_names();
const std::vector<std::string_view>& device_kind_names();

/// The value called exactly `name`, or nullopt.
std::optional<ScheduleKind> find_schedule(std::string_view name);
std::optional<OptimizerKind> find_optimizer(std::string_view name);
std::optional<Precision> find_precision(std::string_view name);
std::optional<Objective> find_objective(std::string_view name);
std::optional<Recompute> find_recompute(std::string_view name);
std::optional<LrScaling> find_lr_scaling(std::string_view name);
std::optional<DeviceKind> find_device_kind(std::string_view name);

/// The value called `name` in any case; throws `Error(kUsage)` "unknown <what> '<name>'[ (did
/// you mean '<closest>'?)]; valid: <names>" otherwise.
ScheduleKind parse_schedule(std::string_view name);
OptimizerKind parse_optimizer(std::string_view name);
Precision parse_precision(std::string_view name);
Objective parse_objective(std::string_view name);
Recompute parse_recompute(std::string_view name);
LrScaling parse_lr_scaling(std::string_view name);

}  // namespace stagecraft
