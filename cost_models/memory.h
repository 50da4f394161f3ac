#pragma once
/// \file
/// Memory anatomy of one pipeline stage: weights, gradients, optimizer states, activations kept
/// for backward (which depend on the schedule), temporaries and communication buffers.
/// The per-parameter numbers are the anchors of DESIGN.md (HF "model memory anatomy",
/// Megatron-LM): mixed-precision AdamW costs 6 + 4 + 8 = 18 bytes per parameter.

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/format/plan.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::cost {

/// Optimizer state bytes per parameter: none and SGD 0, momentum, Nesterov and Adagrad 4 (one
/// buffer), Adam and AdamW 8, 8-bit Adam 2. States are kept in fp32 (8-bit Adam in 8 bits) in both
/// precisions.
double optimizer_state_bytes_per_param(OptimizerKind optimizer, Precision precision);

/// Weight bytes per parameter: fp32 4; mixed 6 when training (fp32 master weights and their
/// 16-bit copy), 2 for inference (the 16-bit copy alone).
double weight_bytes_per_param(Precision precision, bool training);

/// Gradient bytes per parameter when training: 4 (fp32 gradients) in both precisions.
double gradient_bytes_per_param(Precision precision);

/// How many microbatches' activations stage `stage_index` (from 0) of `stages` (P) holds at
/// its peak, with `microbatches` (M) per step and `chunks` (V) model chunks per device:
/// - kGPipe: M (every forward runs before the first backward).
/// - k1F1B and kZBH1: min(P - i, M); the first stage is the heaviest. ZB-H1 keeps 1F1B's
///   peak (Qi et al. 2023, "Zero Bubble Pipeline Parallelism").
/// - kInterleaved: counted in chunk-microbatches (one microbatch through one of the V chunks,
///   1/V of the device's activations): min(M * V, 2 * (P - i - 1) + (V - 1) * P + 1), the
///   warm-up forwards of Megatron-LM's forward_backward_pipelining_with_interleaving plus
///   the one in flight in the steady state. For stage 0 this is P * (1 + (P - 1) / (P * V))
///   device-microbatches, the factor of Korthikanti et al. 2022 ("Reducing Activation
///   Recomputation in Large Transformer Models"). V = 1 is 1F1B.
/// - kZBV: device i's two chunks (V = 2) together in chunk-microbatches, min(2P, 2M, M + i + 1)
///   (counted from torch's ScheduleZBVZeroBubble order): with M >= 2P - 1 every device peaks at
///   1F1B's first device, P whole microbatches (Qi et al. 2024).
/// - kDualPipeV: as kZBV, both chunks together, min(2P + 1, 2M) (counted from torch's
///   ScheduleDualPipeV order, which needs M >= 2P): stage s holds 2P - s as under zb-v, but the
///   forward paired with a backward runs first, so every device peaks one chunk-microbatch
///   above zb-v (DeepSeek's P + 1 microbatches for DualPipeV, in halves).
/// - kInference: 1 (forward only, nothing kept for a backward).
/// Throws `Error(kUsage)` unless P >= 1, 0 <= i < P, M >= 1 and V >= 1.
int64_t microbatches_in_flight(ScheduleKind schedule, int stages, int stage_index, int microbatches,
                               int chunks);

/// A stage's memory anatomy is the plan format's type: what the cost model computes is what the
/// plan records.
using plan::MemoryBytes;

/// The anatomy of a stage with `params` parameters.
/// - Weights, gradients and optimizer states follow the per-parameter functions above: weights
///   for all `params`, gradients and states for the `trainable_params` among them (frozen
///   weights and buffers such as running statistics have neither); gradients and states are 0
///   when not `training` (and states with `OptimizerKind::kNone`). The stage's constants (the
///   initializers that are not weights: masks kept as buffers, index and shape operands) add
///   `constant_bytes` to the weights, which the runtime loads them with.
/// - Activations: `in_flight` * `activation_bytes_per_microbatch`. With `recompute` (training
///   only) each microbatch in flight keeps only its stage input, and one microbatch at a time
///   is re-run to its full activations before its backward:
///   `in_flight` * `stage_input_bytes_per_microbatch` + `activation_bytes_per_microbatch`.
/// - Temporary and communication bytes are taken as given.
/// Throws `Error(kInternal)` on a negative argument and `Error(kPlan)` when the total does not
/// fit in int64.
MemoryBytes stage_memory(int64_t params, int64_t trainable_params,
                         int64_t activation_bytes_per_microbatch, int64_t temporary_peak_bytes,
                         int64_t comm_buffer_bytes, int64_t in_flight, OptimizerKind optimizer,
                         Precision precision, bool training, bool recompute,
                         int64_t stage_input_bytes_per_microbatch, int64_t constant_bytes = 0);

/// One line for plans and memory errors, in the unit of the total and with the parts that are
/// not zero: "41.2 GiB: weights 12.0, gradients 6.0, optimizer 24.0, activations 5.2 for 4
/// microbatches in flight".
std::string describe(const MemoryBytes& anatomy, int64_t in_flight);

}  // namespace stagecraft::cost
