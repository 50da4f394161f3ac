// The optimizer step of one device's worker (device_worker.h): OPT_STEP, the shared weights'
// sums it finishes, ZeRO-1's sharded update and all-gather, and dynamic loss scaling's
// unscale, check and end-of-step update or skip (run_types.h LossScale); gradient clipping's
// part is grad_clip.cpp.
#include <fmt/format.h>

#include <limits>
#include <vector>

#include "runtime/exec/device_worker.h"
#include "runtime/format/error.h"

namespace stagecraft::rt {

void DeviceWorker::sharded_step(int stage_index, float lr, int64_t update) {
  StageRuntime& st = stage(stage_index);
  MemoryMeter& meter = run_.meters[device_];
  auto& grads = grad_acc_[stage_index];
  Tensor& bucket = buckets_.at(stage_index);
  auto slice = [](Tensor& t, int64_t lo, int64_t hi) {
    return Tensor::view(DType::kFloat32, {hi - lo}, t.data + lo * 4);
  };
  double start = run_.seconds();
  for (const StageRuntime::FlatWeight& part : st.flat) {
    Tensor& weight = st.weights.at(part.name);
    optim::OptimizerState& state = st.opt_state[part.name];
    const int64_t state_before = state.bytes();
    if (!st.is_sharded(part)) {  // a shared weight: whole, its gradient summed whole
      run_.optimizer->step(*context_, weight, grads.at(part.name), state, lr, update);
    } else if (auto [lo, hi] = st.own_part(part); lo < hi) {
      // This replica's part of the weight, with the same part of the summed gradient.
      Tensor w = slice(weight, lo, hi);
      Tensor g = slice(bucket, part.offset + lo, part.offset + hi);
      run_.optimizer->step(*context_, w, g, state, lr, update);
    }
    meter.add(state.bytes() - state_before);                   // created on first use
    if (state.tensors.empty()) st.opt_state.erase(part.name);  // no part here
    context_->fill_zero(grads.at(part.name));
  }
  update_timed(stage_index, start);
  // The all-gather: this replica's updated shard into the bucket, every other replica's back.
  start = run_.seconds();
  for (const StageRuntime::FlatWeight& part : st.flat)
    if (auto [lo, hi] = st.own_part(part); st.is_sharded(part) && lo < hi) {
      Tensor target = slice(bucket, part.offset + lo, part.offset + hi);
      context_->copy(slice(st.weights.at(part.name), lo, hi), target);
    }
  Tensor head = slice_rows(bucket, 0, st.sharded);
  transport().replica_all_gather(stage_index, head, st.shard_bounds, *context_);
  for (const StageRuntime::FlatWeight& part : st.flat)
    if (st.is_sharded(part)) {
      Tensor& weight = st.weights.at(part.name);
      Tensor target = slice(weight, 0, part.elements);
      context_->copy(slice(bucket, part.offset, part.offset + part.elements), target);
    }
  // Communication, not compute: counted with the step's all-reduce time.
  double end = run_.seconds();
  run_.allreduce[device_][step_] += end - start;
}

void DeviceWorker::allreduce_shared(const schedule::Instruction& ins) {
  const StageRuntime& st = stage(ins.stage);
  // The stage's part of each shared weight's gradient (zeros where it computes none: its copy
  // must take the same update as the others).
  for (const plan::SharedWeight& w : st.stage->shared_weights) {
    Tensor& acc = grad_acc_[ins.stage][w.name];
    if (acc.dtype == DType::kUndefined) {
      const Tensor& weight = st.weights.at(w.name);
      acc = context_->new_tensor(weight.dtype, weight.shape, true);
      run_.meters[device_].add(acc.bytes());  // the gradient buffer lives for the run
    }
    transport().start_shared_sum(w.name, w.stages, ins.stage, acc, *context_);
    run_.meters[device_].add(acc.bytes());  // the transport's copy, until the sum
  }
}

void DeviceWorker::optimizer_step(const schedule::Instruction& ins) {
  StageRuntime& st = stage(ins.stage);
  MemoryMeter& meter = run_.meters[device_];
  auto& grads = grad_acc_[ins.stage];
  // Shared weights: every holder's gradient summed, the same bytes on each.
  for (const plan::SharedWeight& w : st.stage->shared_weights) {
    Tensor& acc = grads.at(w.name);
    transport().finish_shared_sum(w.name, ins.stage, acc, *context_);
    meter.sub(acc.bytes());
  }
  if (run_.defers_update()) {
    // The gradients unscaled and checked (loss scaling), their squares counted (clipping); the
    // update waits for the step's end, when every device's are.
    const double start = run_.seconds();
    if (run_.scales_loss &&
        !scale_gradients(ins.stage, static_cast<float>(1.0 / run_.pipeline.loss_scale.scale)))
      run_.overflow[static_cast<size_t>(step_)] = true;
    if (run_.clip_grad_norm > 0) count_gradient_squares(ins.stage);
    deferred_.push_back(ins.stage);
    timed(ins.op, ins.stage, -1, start);
    return;
  }
  update_stage(ins.stage);
}

bool DeviceWorker::scale_gradients(int stage_index, float factor) {
  StageRuntime& st = stage(stage_index);
  auto& grads = grad_acc_[stage_index];
  // Every gradient at once: one read of the device's finiteness flag, not one a weight.
  std::vector<Tensor*> all;
  if (st.shard_bounds.empty()) {
    for (const auto& [name, weight] : st.weights)
      if (auto g = grads.find(name); g != grads.end()) all.push_back(&g->second);
    return context_->unscale_many(all.data(), all.size(), factor);
  }
  // ZeRO-1: the shared weights' gradients are summed whole, the sharded ones are this replica's
  // shard of the flat bucket (what sharded_step reads); the other replicas check theirs.
  for (const StageRuntime::FlatWeight& part : st.flat)
    if (!st.is_sharded(part)) all.push_back(&grads.at(part.name));
  Tensor shard;
  if (st.shard_hi > st.shard_lo) {
    shard = slice_rows(buckets_.at(stage_index), st.shard_lo, st.shard_hi);
    all.push_back(&shard);
  }
  return context_->unscale_many(all.data(), all.size(), factor);
}

void DeviceWorker::update_timed(int stage_index, double start) {
  if (!updating_deferred_) return timed(schedule::Op::kOptimizerStep, stage_index, -1, start);
  // After the step's instructions: busy time, but no second OPT_STEP event on the timeline (a
  // trace's events are the schedule's instructions, one each; the OPT_STEP's was recorded).
  run_.busy[device_][step_] += run_.seconds() - start;
}

void DeviceWorker::finish_deferred_step() {
  const auto step = static_cast<size_t>(step_);
  const bool skip = run_.scales_loss && run_.overflow[step].load();
  // Clipping: every device's squares are in (the end barrier); a skipped step stays skipped.
  if (run_.clip_grad_norm > 0 && !skip) clip_gradients();
  updating_deferred_ = true;
  for (int stage_index : deferred_) {
    if (!skip) {
      update_stage(stage_index);
      continue;
    }
    // Skipped: no weight and no optimizer state changes; the gradients start the next step
    // from zero as after an update.
    for (auto& [name, g] : grad_acc_[stage_index]) context_->fill_zero(g);
  }
  updating_deferred_ = false;
  deferred_.clear();
  if (device_ != run_.first_device) return;
  if (run_.clip_grad_norm > 0) run_.step_grad_norm[step] = run_.grad_norm(step_);
  if (!run_.scales_loss) return;
  // The first device alone moves the scale on, between the two barriers of the step's end:
  // every worker read it before (the seeds) and reads it again after.
  LossScale& ls = run_.pipeline.loss_scale;
  run_.step_scale[step] = ls.scale;
  run_.step_skipped[step] = skip;
  if (skip) {
    ls.scale /= 2;
    ls.clean_steps = 0;
    ++ls.skipped;
  } else if (++ls.clean_steps >= ls.window) {
    if (ls.scale * 2 <= std::numeric_limits<float>::max()) ls.scale *= 2;
    ls.clean_steps = 0;
  }
}

void DeviceWorker::update_stage(int stage_index) {
  StageRuntime& st = stage(stage_index);
  MemoryMeter& meter = run_.meters[device_];
  auto& grads = grad_acc_[stage_index];
  const int64_t update = run_.global_step + step_ + 1;
  float lr = static_cast<float>(optim::lr_at(run_.lr_schedule, update));
  if (!st.shard_bounds.empty()) {
    sharded_step(stage_index, lr, update);
    return;
  }
  double start = run_.seconds();
  // Every weight with a gradient at once (one launch for many on CUDA), each gradient zeroed
  // for the next step.
  std::vector<optim::Optimizer::WeightStep> steps;
  int64_t state_before = 0;
  for (auto& [name, weight] : st.weights) {
    auto g = grads.find(name);
    if (g == grads.end()) continue;  // not trainable or no gradient
    optim::OptimizerState& state = st.opt_state[name];
    state_before += state.bytes();
    steps.push_back({&weight, &g->second, &state});
  }
  run_.optimizer->step_many(*context_, steps, lr, update);
  int64_t state_after = 0;
  for (const optim::Optimizer::WeightStep& s : steps) state_after += s.state->bytes();
  meter.add(state_after - state_before);  // created on first use
  update_timed(stage_index, start);
}

}  // namespace stagecraft::rt
