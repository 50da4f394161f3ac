// DualPipeV: DeepSeek's DualPipe "cut in half" (DeepSeek-V3 technical report, section 3.2;
// github.com/deepseek-ai/DualPipe, dualpipev.py), in the order torch.distributed.pipelining's
// ScheduleDualPipeV gives each rank.
#include <deque>
#include <utility>

#include "compiler/schedule/program_writer.h"

namespace stagecraft::schedule {
namespace {

/// One of the device's two chunks, with the next microbatch of its forwards and backwards.
struct Chunk {
  int stage;
  int next_forward = 0;
  int next_backward = 0;
};

/// Writes one device's DualPipeV order: the counters of its two chunks and the first-in
/// first-out queue of the weight gradients its split backwards leave for later.
class DualPipeVWriter {
 public:
  DualPipeVWriter(const PipelineShape& shape, int device)
      : writer_(shape, device),
        first_{writer_.stage_of_chunk(0)},
        second_{writer_.stage_of_chunk(1)} {}

  Chunk& first() { return first_; }
  Chunk& second() { return second_; }

  void forward(Chunk& chunk) { writer_.forward(chunk.stage, chunk.next_forward++); }

  /// A full backward: input and weight gradients together (BWD).
  void backward(Chunk& chunk) { writer_.backward(chunk.stage, chunk.next_backward++); }

  /// B alone (BWD_INPUT); its W joins the queue.
  void backward_input(Chunk& chunk) {
    writer_.backward_input(chunk.stage, chunk.next_backward);
    weights_.emplace_back(chunk.stage, chunk.next_backward++);
  }

  /// The W of the oldest B whose W has not run, if any.
  void weight() {
    if (weights_.empty()) return;
    const auto [stage, microbatch] = weights_.front();
    weights_.pop_front();
    writer_.backward_weight(stage, microbatch);
  }

  /// DualPipeV's overlapped pair (torch's OVERLAP_F_B): the forward of one chunk and the full
  /// backward of the other, written as two adjacent compute instructions, F first. stagecraft
  /// runs them back to back, as torch's runtime does unless the user overrides its overlap
  /// callback, and the simulator charges them one after the other.
  void overlapped(Chunk& forwarded, Chunk& backwarded) {
    forward(forwarded);
    backward(backwarded);
  }

  std::vector<Instruction> finish() {
    writer_.finish_step();
    return writer_.take();
  }

 private:
  ProgramWriter writer_;
  Chunk first_, second_;
  std::deque<std::pair<int, int>> weights_;  // (stage, microbatch) of each B awaiting its W
};

}  // namespace

/// Device i holds chunk 0 (stage i, on the way down the V) and chunk 1 (stage 2P-1-i, on the way
/// back up); with M >= 2P microbatches its order has eight phases:
/// 1. 2(P-1-i) forwards of chunk 0;
/// 2. i+1 times a forward of chunk 0 and one of chunk 1;
/// 3. P-1-i times B of chunk 1, a W, a forward of chunk 1 (the W right away: zero bubble);
/// 4. M-2P+i+1 times the pair (forward of chunk 0, backward of chunk 1) and the pair (forward of
///    chunk 1, backward of chunk 0), full backwards (torch does not overlap the last device's
///    first pair, which runs the same two ops in the same order);
/// 5. P-1-i times a backward of chunk 1 and the pair (forward of chunk 1, backward of chunk 0);
/// 6. i+1 times a backward of chunk 1 and one of chunk 0, the later half split into B and a
///    queued W: from round (i+1)/2 on, that round's chunk-1 backward too when i is odd;
/// 7. P-1-i times a queued W and B of chunk 0;
/// 8. the i+1 queued W left.
/// Stage s holds at most 2P - s microbatches in flight, as under zb-v; the device holds 2P + 1
/// chunk-microbatches at its peak, the forward of a pair running before its backward frees one.
std::vector<Instruction> dual_pipe_v(const PipelineShape& shape, int device) {
  DualPipeVWriter w(shape, device);
  const int devices = shape.devices, microbatches = shape.microbatches;
  Chunk& c0 = w.first();
  Chunk& c1 = w.second();
  const int down = devices - 1 - device;  // the devices after this one on the way down
  for (int k = 0; k < 2 * down; ++k) w.forward(c0);
  for (int k = 0; k < device + 1; ++k) {
    w.forward(c0);
    w.forward(c1);
  }
  for (int k = 0; k < down; ++k) {
    w.backward_input(c1);
    w.weight();
    w.forward(c1);
  }
  for (int k = 0; k < microbatches - 2 * devices + device + 1; ++k) {
    w.overlapped(c0, c1);
    w.overlapped(c1, c0);
  }
  for (int k = 0; k < down; ++k) {
    w.backward(c1);
    w.overlapped(c1, c0);
  }
  const int rounds = device + 1, half = rounds / 2;
  for (int k = 0; k < rounds; ++k) {
    if (k > half || (k == half && device % 2 == 1)) {
      w.backward_input(c1);
    } else {
      w.backward(c1);
    }
    if (k >= half) {
      w.backward_input(c0);
    } else {
      w.backward(c0);
    }
  }
  for (int k = 0; k < down; ++k) {
    w.weight();
    w.backward_input(c0);
  }
  for (int k = 0; k < rounds; ++k) w.weight();
  return w.finish();
}

}  // namespace stagecraft::schedule
