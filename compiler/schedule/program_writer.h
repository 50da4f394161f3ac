#pragma once
/// \file
/// What the schedule builders share (internal to compiler/schedule): `ProgramWriter`, which
/// writes one device's program from the order of its compute ops with the transfers around each,
/// and the builders kept in files of their own.

#include <utility>
#include <vector>

#include "runtime/format/schedule.h"

namespace stagecraft::schedule {

/// Appends one device's instructions, with the transfers around each compute op.
class ProgramWriter {
 public:
  ProgramWriter(const PipelineShape& shape, int device) : shape_(shape), device_(device) {}

  /// Receives the activations (unless first stage), runs the forward, sends them on (unless
  /// last stage).
  void forward(int stage, int microbatch) {
    if (stage > 0) program_.push_back({Op::kRecvAct, stage, microbatch, stage - 1});
    program_.push_back({Op::kForward, stage, microbatch});
    if (stage < last_stage()) program_.push_back({Op::kSendAct, stage, microbatch, stage + 1});
  }

  /// A full backward (input and weight gradients together).
  void backward(int stage, int microbatch) { input_gradient(Op::kBackward, stage, microbatch); }

  /// ZB's B: the input gradient, with its transfers.
  void backward_input(int stage, int microbatch) {
    input_gradient(Op::kBackwardInput, stage, microbatch);
  }

  /// ZB's W: the weight gradient, which needs no transfer.
  void backward_weight(int stage, int microbatch) {
    program_.push_back({Op::kBackwardWeight, stage, microbatch});
  }

  /// The end of a training step: all-reduce (with data parallelism), the start of the shared
  /// weights' exchange, and optimizer step of every stage of the device. Every exchange of the
  /// device starts before any of its optimizer steps waits for one.
  void finish_step() {
    if (shape_.data_parallel > 1) {
      for (int chunk = 0; chunk < shape_.chunks; ++chunk) {
        program_.push_back({Op::kAllReduce, stage_of_chunk(chunk), -1});
      }
    }
    for (int chunk = 0; chunk < shape_.chunks; ++chunk) {
      if (holds_shared(shape_, stage_of_chunk(chunk)))
        program_.push_back({Op::kAllReduceShared, stage_of_chunk(chunk), -1});
    }
    for (int chunk = 0; chunk < shape_.chunks; ++chunk) {
      program_.push_back({Op::kOptimizerStep, stage_of_chunk(chunk), -1});
    }
  }

  /// The stage that is chunk `chunk` of this device.
  int stage_of_chunk(int chunk) const { return schedule::stage_of_chunk(device_, chunk, shape_); }

  std::vector<Instruction> take() { return std::move(program_); }

 private:
  int last_stage() const { return stage_count(shape_) - 1; }

  void input_gradient(Op op, int stage, int microbatch) {
    if (stage < last_stage()) program_.push_back({Op::kRecvGrad, stage, microbatch, stage + 1});
    program_.push_back({op, stage, microbatch});
    if (stage > 0) program_.push_back({Op::kSendGrad, stage, microbatch, stage - 1});
  }

  const PipelineShape& shape_;
  int device_;
  std::vector<Instruction> program_;
};

/// DualPipeV's program for `device` (dualpipev.cpp); `shape` has passed check_schedule_shape.
std::vector<Instruction> dual_pipe_v(const PipelineShape& shape, int device);

}  // namespace stagecraft::schedule
