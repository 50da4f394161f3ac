// The schedule builders (dualpipev's in dualpipev.cpp). Each writes one device's program from
// the order of its compute ops; `ProgramWriter` (program_writer.h) adds the receives before and
// the sends after each of them, so the builders read like the schedules' published pseudo-code.
#include "compiler/schedule/build_schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "compiler/schedule/program_writer.h"
#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

/// GPipe: every forward, then every backward in reverse microbatch order (the order autograd
/// walks a concatenated batch; any order gives the same bubble).
std::vector<Instruction> gpipe(const PipelineShape& shape, int device) {
  ProgramWriter writer(shape, device);
  for (int mb = 0; mb < shape.microbatches; ++mb) writer.forward(device, mb);
  for (int mb = shape.microbatches - 1; mb >= 0; --mb) writer.backward(device, mb);
  writer.finish_step();
  return writer.take();
}

/// 1F1B (PipeDream-Flush, Megatron-LM's non-interleaved schedule): P - i - 1 warm-up forwards
/// on device i, then one forward and one backward in turn, then the remaining backwards. At
/// most P - i microbatches are in flight on device i.
std::vector<Instruction> one_f_one_b(const PipelineShape& shape, int device) {
  ProgramWriter writer(shape, device);
  int microbatches = shape.microbatches;
  int warmup = std::min(shape.devices - device - 1, microbatches);
  for (int mb = 0; mb < warmup; ++mb) writer.forward(device, mb);
  for (int mb = 0; mb < microbatches; ++mb) {
    if (warmup + mb < microbatches) writer.forward(device, warmup + mb);
    writer.backward(device, mb);
  }
  writer.finish_step();
  return writer.take();
}

/// ZB-H1 (Qi et al. 2023, section 3.1; the hand-crafted schedule of their repository): the
/// warm-up and the F/B order of 1F1B, with the backward split into B and W. Device i runs the
/// W of microbatch k right after the B of microbatch k + i, so i weight gradients are always
/// pending; those W fill the cool-down, where 1F1B waits for gradients. A device holds at most
/// P microbatches of activations, the peak of 1F1B's first device.
std::vector<Instruction> zb_h1(const PipelineShape& shape, int device) {
  ProgramWriter writer(shape, device);
  int microbatches = shape.microbatches;
  int warmup = std::min(shape.devices - device - 1, microbatches);
  int lag = device;
  for (int mb = 0; mb < warmup; ++mb) writer.forward(device, mb);
  int next_weight = 0;
  for (int mb = 0; mb < microbatches; ++mb) {
    if (warmup + mb < microbatches) writer.forward(device, warmup + mb);
    writer.backward_input(device, mb);
    if (mb >= lag) writer.backward_weight(device, next_weight++);
  }
  while (next_weight < microbatches) writer.backward_weight(device, next_weight++);
  writer.finish_step();
  return writer.take();
}

/// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021; forward_backward_pipelining_with_
/// interleaving). Microbatches go through the chunks in groups of P: virtual microbatch k is
/// microbatch (k / PV) * P + k % P on chunk (k % PV) / P (backwards walk the chunks in
/// reverse). Device i warms up with 2 (P - i - 1) + (V - 1) P forwards, then alternates.
std::vector<Instruction> interleaved(const PipelineShape& shape, int device) {
  int devices = shape.devices;
  int chunks = shape.chunks;
  int group = devices * chunks;
  int total = shape.microbatches * chunks;
  ProgramWriter writer(shape, device);
  auto microbatch_of = [&](int k) { return (k / group) * devices + k % devices; };
  auto forward = [&](int k) {
    writer.forward(writer.stage_of_chunk((k % group) / devices), microbatch_of(k));
  };
  auto backward = [&](int k) {
    writer.backward(writer.stage_of_chunk(chunks - 1 - (k % group) / devices), microbatch_of(k));
  };
  int warmup = std::min(2 * (devices - device - 1) + (chunks - 1) * devices, total);
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = 0; k < total; ++k) {
    if (warmup + k < total) forward(warmup + k);
    backward(k);
  }
  writer.finish_step();
  return writer.take();
}

/// ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"), in the order of
/// torch.distributed.pipelining's ScheduleZBVZeroBubble. Device i holds chunk 0 (stage i) and
/// chunk 1 (stage 2P-1-i) of the V, so the loss stage and the first stage share device 0. The
/// order is written for N = max(M, 2P - 1) microbatches, and the microbatches from M on are
/// left out, as torch leaves their slots idle:
/// - warm-up: 2(P-i)-1 forwards of chunk 0; i times a forward of chunk 1 and one of chunk 0;
///   P-i times a forward of chunk 1 followed by its B and W;
/// - steady state: a forward of chunk 0 (while any is left), B and W of chunk 0, a forward of
///   chunk 1, B and W of chunk 1, until both chunks have forwarded all N;
/// - cool-down: i times B of chunk 0 and B of chunk 1; P-i times B of chunk 0 and a deferred W
///   of chunk 0; then the deferred W of chunk 1, then those of chunk 0.
/// Stage s holds at most min(2P - s, M) microbatches in flight (each chunk half a device's
/// layers), 1F1B's peak on device 0 counted in chunk-microbatches.
std::vector<Instruction> zb_v(const PipelineShape& shape, int device) {
  ProgramWriter writer(shape, device);
  const int devices = shape.devices, microbatches = shape.microbatches;
  const int padded = std::max(microbatches, 2 * devices - 1);
  const int first = writer.stage_of_chunk(0), second = writer.stage_of_chunk(1);
  // The next forward and B of each chunk; only the microbatches that exist are written.
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  auto forward = [&](int stage, int& next) {
    if (next < microbatches) writer.forward(stage, next);
    ++next;
  };
  auto input = [&](int stage, int& next) {
    if (next < microbatches) writer.backward_input(stage, next);
    ++next;
  };
  auto weight = [&](int stage, int mb) {
    if (mb < microbatches) writer.backward_weight(stage, mb);
  };
  auto input_and_weight = [&](int stage, int& next) {
    input(stage, next);
    weight(stage, next - 1);
  };
  for (int k = 0; k < 2 * (devices - device) - 1; ++k) forward(first, f0);
  for (int k = 0; k < device; ++k) {
    forward(second, f1);
    forward(first, f0);
  }
  for (int k = 0; k < devices - device; ++k) {
    forward(second, f1);
    input_and_weight(second, b1);
  }
  while (f1 < f0 || f0 < padded) {
    if (f0 < padded) forward(first, f0);
    input_and_weight(first, b0);
    forward(second, f1);
    input_and_weight(second, b1);
  }
  int w0 = b0, w1 = b1;
  for (int k = 0; k < device; ++k) {
    input(first, b0);
    input(second, b1);
  }
  for (int k = 0; k < devices - device; ++k) {
    input(first, b0);
    weight(first, w0++);
  }
  while (w1 < b1) weight(second, w1++);
  while (w0 < b0) weight(first, w0++);
  writer.finish_step();
  return writer.take();
}

/// Inference: each device forwards the microbatches in order as they arrive.
std::vector<Instruction> inference(const PipelineShape& shape, int device) {
  ProgramWriter writer(shape, device);
  for (int mb = 0; mb < shape.microbatches; ++mb) writer.forward(device, mb);
  return writer.take();
}

}  // namespace

Schedule schedule_from_order(const ComputeOrder& order, const PipelineShape& shape) {
  if (static_cast<int>(order.size()) != shape.devices)
    fail(ErrorKind::kUsage, "a compute order of {} devices for a pipeline of {}", order.size(),
         shape.devices);
  Schedule schedule;
  for (int device = 0; device < shape.devices; ++device) {
    ProgramWriter writer(shape, device);
    for (const Instruction& in : order[device]) {
      switch (in.op) {
        case Op::kForward:
          writer.forward(in.stage, in.microbatch);
          break;
        case Op::kBackward:
          writer.backward(in.stage, in.microbatch);
          break;
        case Op::kBackwardInput:
          writer.backward_input(in.stage, in.microbatch);
          break;
        case Op::kBackwardWeight:
          writer.backward_weight(in.stage, in.microbatch);
          break;
        default:
          fail(ErrorKind::kUsage, "device {}: {} is not a compute instruction", device,
               to_string(in.op));
      }
    }
    if (shape.training) writer.finish_step();
    schedule.push_back(writer.take());
  }
  return schedule;
}

Schedule build_schedule(ScheduleKind kind, const PipelineShape& shape) {
  check_schedule_shape(kind, shape, ErrorKind::kUsage);
  Schedule schedule;
  for (int device = 0; device < shape.devices; ++device) {
    switch (kind) {
      case ScheduleKind::kGPipe:
        schedule.push_back(gpipe(shape, device));
        break;
      case ScheduleKind::k1F1B:
        schedule.push_back(one_f_one_b(shape, device));
        break;
      case ScheduleKind::kInterleaved:
        // With one chunk per device the interleaved schedule is 1F1B (Megatron-LM picks the
        // non-interleaved code for it); its warm-up formula would hold more in flight.
        schedule.push_back(shape.chunks == 1 ? one_f_one_b(shape, device)
                                             : interleaved(shape, device));
        break;
      case ScheduleKind::kZBH1:
        schedule.push_back(zb_h1(shape, device));
        break;
      case ScheduleKind::kZBV:
        schedule.push_back(zb_v(shape, device));
        break;
      case ScheduleKind::kDualPipeV:
        schedule.push_back(dual_pipe_v(shape, device));
        break;
      case ScheduleKind::kInference:
        schedule.push_back(inference(shape, device));
        break;
      case ScheduleKind::kCustom:
        fail(ErrorKind::kUsage,
             "schedule 'custom' is read from a file (stagec --schedule-csv FILE), not built");
    }
  }
  return schedule;
}

}  // namespace stagecraft::schedule
