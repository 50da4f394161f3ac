// One device's worker (device_worker.h): one method per schedule instruction.
#include "runtime/exec/device_worker.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::rt {

DeviceWorker::DeviceWorker(int device, RunState& run)
    : device_(device),
      replica_(device / run.pipeline_devices),
      pipeline_device_(device % run.pipeline_devices),
      run_(run),
      where_(fmt::format("device {}", device)) {}

std::vector<StageRuntime*> DeviceWorker::own_stages() const {
  std::vector<StageRuntime*> out;
  for (size_t k = 0; k < run_.pipeline.plan.stages.size(); ++k) {
    StageRuntime& st = stage(static_cast<int>(k));
    if (st.stage->device == pipeline_device_) out.push_back(&st);
  }
  return out;
}

void DeviceWorker::run() {
  auto guarded = [&](auto&& body) {
    try {
      body();
    } catch (const Aborted&) {
      // Another worker failed first; its error is the one reported.
    } catch (Error& e) {
      if (e.context().empty() || e.context().front() != where_) e.in(where_);
      run_.stop_all(std::move(e));
    } catch (const std::exception& e) {
      run_.stop_all(error_from(e, ErrorKind::kInternal).in(where_));
    }
  };
  guarded([&] {
    setup();
    for (step_ = 0; step_ < run_.steps; ++step_) {
      const DeviceContext::HostWaits before = context_->host_waits();
      run_step();
      const bool go_on = after_step();
      const DeviceContext::HostWaits after = context_->host_waits();
      if (after.count >= 0)
        run_.host_waits[device_][step_] = {after.count - before.count,
                                           after.seconds - before.seconds};
      if (!go_on) break;
    }
    DeviceContext::MemoryUse use = context_->memory_use();
    run_.reports[device_].device_peak_bytes = use.peak_bytes;
    run_.reports[device_].device_used_bytes = use.used_bytes;
  });
  guarded([&] { end_run(); });
}

void DeviceWorker::setup() {
  const PipelineParts& p = run_.pipeline;
  omp_set_num_threads(p.threads_per_device);
  ResidentDevice& home = resident();
  if (home.context) {  // kept from the pipeline's last run
    context_ = std::move(home.context);
    context_->bind_thread();
  } else {
    context_ = p.backend.make_device(device_, p.threads_per_device);
  }
  context_->deterministic = run_.options.deterministic;
  if (!context_->host_visible())
    for (StageRuntime* st : own_stages())
      if (!st->on_device) upload_stage(*context_, *st, run_.global_step);
  int64_t arena_bytes = 0, weight_bytes = 0;
  for (StageRuntime* st : own_stages()) {
    // Training keeps the forward values whose bytes the backward reads (StageRuntime::stash);
    // the others live in the arena, as in inference. The backward runs in the arena too (never
    // at the same time as a forward).
    arena_bytes = std::max(arena_bytes, st->program.arena_bytes());
    if (run_.training) arena_bytes = std::max(arena_bytes, st->backward->arena_bytes());
    weight_bytes += st->program.weight_bytes();
  }
  // One arena per device: its stages run one at a time, so the largest plan serves all.
  if (home.arena && home.arena->size() >= arena_bytes) {
    arena_ = std::move(home.arena);
  } else {
    home.arena.reset();
    arena_ = context_->allocate(arena_bytes);
  }
  MemoryMeter& meter = run_.meters[device_];
  run_.reports[device_].arena_bytes = arena_bytes;
  run_.reports[device_].weight_bytes = weight_bytes;
  meter.add(arena_bytes + weight_bytes);
  for (StageRuntime* st : own_stages())  // optimizer state kept from earlier runs or a checkpoint
    for (const auto& [name, state] : st->opt_state) meter.add(state.bytes());
  hook_.before = [this](std::string_view node, std::string_view op_type) {
    if (run_.hook.before) run_.hook.before(node, op_type);
    if (sums_in_flight_ > 0) progress_sums();
  };
  if (run_.training && run_.replicas > 1) plan_buckets();
  pin_feeds();
}

void DeviceWorker::download(int64_t step) {
  for (StageRuntime* st : own_stages()) download_stage(*context_, *st, step);
}

void DeviceWorker::end_run() {
  if (context_ == nullptr) return;
  unpin_feeds();
  if (!run_.failed()) {  // the next run goes on with the device as this one leaves it
    context_->unbind_thread();
    ResidentDevice& home = resident();
    home.context = std::move(context_);
    home.arena = std::move(arena_);
    return;
  }
  // A failed run: the context and arena go with this worker, and the weights and optimizer
  // state back to the host as the failure left them (as the CPU's, which are the host's: a step
  // cut short may have updated some weights). A device that cannot be read any more loses what
  // training changed since the host last got it, and the run's error says so.
  if (context_->host_visible()) return;
  try {
    download(run_.global_step + step_);
  } catch (const std::exception& e) {
    int64_t since = -1;
    for (StageRuntime* st : own_stages())
      if (st->on_device && st->host_stale)
        since = since < 0 ? st->host_step : std::min(since, st->host_step);
    if (since >= 0)
      run_.note_failure(fmt::format(
          "device {}'s weights and optimizer state could not be read back after the failure ({}): "
          "the host holds them as of step {}; what training changed since is lost",
          device_, e.what(), since));
  }
  for (StageRuntime* st : own_stages()) release_stage(*st);
}

void DeviceWorker::wait_for_all(const char* when) {
  try {
    run_.barrier_step.store(step_);
    run_.barrier.arrive_and_wait();
  } catch (Error& e) {
    e.in(fmt::format("step {}: {}", run_.global_step + step_ + 1, when));
    throw;
  }
}

void DeviceWorker::run_step() {
  wait_for_all("waiting for every device at the step's start");
  run_.device_step_start[device_][step_] = run_.seconds();  // the step's start: the earliest
  if (keeps_for_backward())  // a training step changes the weights (and running statistics)
    for (StageRuntime* st : own_stages()) st->host_stale = st->on_device;
  sample_memory();
  const std::vector<schedule::Instruction>& list =
      run_.pipeline.schedule[static_cast<size_t>(pipeline_device_)];
  const int64_t step = run_.global_step + step_ + 1;
  hook_.timed = nullptr;
  if (run_.options.profile_step == step_ + 1)
    hook_.timed = [this](std::string_view node, std::string_view op_type, double ms,
                         const NodeWork& work,
                         std::string_view note) { profile_node(node, op_type, ms, work, note); };
  // NVTX ranges name the instructions on CUDA: each name is formatted once per worker (the
  // instruction as the schedule writes it), not on every run of it.
  const bool ranges = !context_->host_visible();
  if (ranges && range_names_.size() != list.size())
    for (size_t i = range_names_.size(); i < list.size(); ++i)
      range_names_.push_back(schedule::to_string(list[i]));
  for (size_t index = 0; index < list.size(); ++index) {
    const schedule::Instruction& ins = list[index];
    // An evaluation runs the forward part of the list only, in its order.
    if (run_.options.forward_only && ins.op != schedule::Op::kRecvAct &&
        ins.op != schedule::Op::kForward && ins.op != schedule::Op::kSendAct)
      continue;
    if (run_.options.before_instruction) run_.options.before_instruction(device_, step, index);
    // The context (device, step, instruction) is built only when something fails.
    auto context = [&] { return fmt::format("step {}: {}", step, schedule::to_string(ins)); };
    try {
      index_ = index;
      if (ranges) context_->range_push(range_names_[index].c_str());
      execute(ins);
      if (ranges) context_->range_pop();
      if (sums_in_flight_ > 0) progress_sums();  // the sums go on between instructions too
      sample_memory();
    } catch (Error& e) {
      e.in(context()).in(where_);
      throw;
    } catch (const Aborted&) {
      throw;
    } catch (const std::exception& e) {
      throw error_from(e, ErrorKind::kInternal).in(context()).in(where_);
    }
  }
  drop_step_copies();  // every backward of the step has run; the optimizer changes the weights
}

void DeviceWorker::share_step_copies(int stage_index, const StageRuntime& st,
                                     std::map<std::string, Tensor>& keep) {
  if (st.step_copies.empty()) return;
  auto& shared = step_copies_[stage_index];
  for (const std::string& name : st.step_copies) {
    auto it = keep.find(name);
    if (it == keep.end()) continue;
    auto [copy, added] = shared.try_emplace(name, it->second);
    if (added)
      run_.meters[device_].add(it->second.bytes());
    else
      it->second = copy->second;  // this microbatch's own copy goes back to the device now
  }
}

void DeviceWorker::drop_step_copies() {
  for (auto& [stage_index, copies] : step_copies_) {
    int64_t bytes = 0;
    for (const auto& [name, t] : copies) bytes += t.bytes();
    run_.meters[device_].sub(bytes);
    copies.clear();
  }
}

int64_t DeviceWorker::kept_bytes(const StageRuntime& st,
                                 const std::map<std::string, Tensor>& values) {
  int64_t total = 0;
  for (const auto& [name, t] : values)
    if (!st.weights.count(name) && !st.step_copies.count(name)) total += t.bytes();
  return total;
}

void DeviceWorker::profile_node(std::string_view node, std::string_view op_type, double ms,
                                const NodeWork& work, std::string_view note) {
  const schedule::Instruction& ins =
      run_.pipeline.schedule[static_cast<size_t>(pipeline_device_)][index_];
  std::string kind = schedule::to_string(ins.op);
  std::vector<NodeProfile>& list = run_.node_profile[static_cast<size_t>(device_)];
  auto key = std::make_tuple(ins.stage, kind, std::string(node));
  auto [it, added] = profile_index_.try_emplace(key, list.size());
  if (added) {
    NodeProfile entry;
    entry.device = device_;
    entry.stage = ins.stage;
    entry.instruction = std::move(kind);
    entry.node = std::string(node);
    entry.op_type = std::string(op_type);
    list.push_back(std::move(entry));
  }
  NodeProfile& entry = list[it->second];
  entry.calls += 1;
  entry.ms += ms;
  entry.bytes += work.bytes_read + work.bytes_written;
  entry.flops += work.flops;
  if (entry.note.empty()) entry.note = note;
}

bool DeviceWorker::after_step() {
  wait_for_all("waiting for every device at the step's end");
  const RunOptions& options = run_.options;
  // An evaluation (forward only) has nothing to update or save.
  if (run_.defers_update() && !options.forward_only) {
    finish_deferred_step();
    wait_for_all("waiting for every device's optimizer update");
  }
  // Read once, between the step's last barrier and the next: every device of every process
  // reads the same (RunState::stop_signal).
  const bool stopping = run_.stop_signal.load() != 0;
  const int64_t done = run_.global_step + step_ + 1;
  if (device_ == run_.first_device) {
    run_.step_end[step_] = run_.seconds();
    if (options.progress) options.progress(step_ + 1, run_.steps, run_.step_end[step_]);
  }
  bool checkpoint = run_.training && !options.forward_only && options.checkpoint &&
                    ((options.checkpoint_at_end && step_ + 1 == run_.steps) || stopping ||
                     (options.checkpoint_every > 0 && done % options.checkpoint_every == 0));
  if (!checkpoint) return !stopping;
  // A device of its own memory first gives the host its weights and optimizer state.
  if (!context_->host_visible()) {
    download(done);
    run_.barrier.arrive_and_wait();
  }
  // Device 0 saves while the others wait at the barrier (nothing changes the weights).
  if (device_ == run_.first_device) {
    run_.pipeline.steps_done = done;
    try {
      options.checkpoint(done);
    } catch (Error& e) {
      run_.stop_all(std::move(e));
      throw Aborted();
    }
  }
  run_.barrier.arrive_and_wait();
  return !stopping;
}

void DeviceWorker::execute(const schedule::Instruction& ins) {
  switch (ins.op) {
    case schedule::Op::kRecvAct:
      return recv_act(ins);
    case schedule::Op::kForward:
      return forward(ins);
    case schedule::Op::kSendAct:
      return send_act(ins);
    case schedule::Op::kRecvGrad:
      return recv_grad(ins);
    case schedule::Op::kBackward:
      return backward(ins);
    case schedule::Op::kBackwardInput:
      return backward_input(ins);
    case schedule::Op::kBackwardWeight:
      return backward_weight(ins);
    case schedule::Op::kSendGrad:
      return send_grad(ins);
    case schedule::Op::kAllReduce:
      return allreduce(ins);
    case schedule::Op::kAllReduceShared:
      return allreduce_shared(ins);
    case schedule::Op::kOptimizerStep:
      return optimizer_step(ins);
  }
  fail(ErrorKind::kInternal, "instruction op {} is unknown", static_cast<int>(ins.op));
}

void DeviceWorker::timed(schedule::Op op, int stage, int microbatch, double start) {
  double end = run_.seconds();
  run_.busy[device_][step_] += end - start;
  if (tracing()) run_.events[device_].push_back({device_, op, stage, microbatch, start, end});
}

void DeviceWorker::waited(const schedule::Instruction& ins, double start) {
  const double end = run_.seconds();
  if (tracing())
    run_.events[device_].push_back({device_, ins.op, ins.stage, ins.microbatch, start, end});
  if (ins.op == schedule::Op::kSendAct || ins.op == schedule::Op::kSendGrad)
    run_.sends[device_][step_] += end - start;
}

void DeviceWorker::sample_memory() {
  if (!tracing()) return;
  run_.memory[device_].push_back(
      {device_, run_.seconds(), run_.meters[device_].current.load()});
}

void DeviceWorker::recv_act(const schedule::Instruction& ins) {
  const double start = run_.seconds();
  auto& slot = received_[{ins.stage, ins.microbatch}];
  for (int from : stage(ins.stage).producers) {
    Message m = transport().recv({from, ins.stage, false}, ins.microbatch);
    for (NamedTensor& t : m.tensors) slot.push_back({t.name, context_->adopt(t.tensor)});
  }
  waited(ins, start);
}

// A microbatch's loss: kept for the step's mean; NaN or Inf stops the run unless told to skip.
void DeviceWorker::record_loss(const schedule::Instruction& ins, float loss) {
  if (!std::isfinite(loss) && !run_.options.skip_nonfinite)
    fail(ErrorKind::kModel,
         "the loss is {} {} {}, microbatch {} (stage {}); stopping (--skip-nonfinite goes on)",
         loss, run_.options.forward_only ? "in the evaluation after step" : "at step",
         run_.global_step + (run_.options.forward_only ? 0 : step_ + 1), ins.microbatch,
         ins.stage);
  run_.loss_of(step_, batch_index(ins.microbatch)) = loss;
}

void DeviceWorker::forward(const schedule::Instruction& ins) {
  StageRuntime& st = stage(ins.stage);
  const bool training = keeps_for_backward();
  MemoryMeter& meter = run_.meters[device_];
  const Key key{ins.stage, ins.microbatch};
  std::vector<NamedTensor> got = std::move(received_[key]);
  received_.erase(key);
  std::vector<Tensor> args;
  for (const ValueInfo& in : st.program.inputs()) {
    auto it = std::find_if(got.begin(), got.end(),
                           [&](const NamedTensor& t) { return t.name == in.name; });
    if (it != got.end())
      args.push_back(it->tensor);
    else if (auto f = run_.feeds.find(in.name); f != run_.feeds.end())
      args.push_back(to_device_pending(*context_, f->second[batch_index(ins.microbatch)]));
    else
      fail(ErrorKind::kPlan, "input '{}' of stage {} was never received", in.name, ins.stage);
  }
  double start = run_.seconds();
  std::vector<Tensor> outs;
  if (training && st.stage->recompute) {
    // Keep the inputs only (the received ones stay metered); the backward re-runs the
    // forward from them.
    outs = st.program.run(*context_, args, arena_->base(), &hook_, program_run(ins, true));
    if (!st.loss.empty()) record_loss(ins, read_float(*context_, outs.at(loss_output(st))));
    recompute_[key] = Recompute{args, bytes_of(got), 0};
  } else if (training) {
    auto& keep = stash_[key];
    outs = st.program.run_keeping(*context_, args, keep, st.stash, arena_->base(), &hook_,
                                  program_run(ins, true));
    share_step_copies(ins.stage, st, keep);
    // The received inputs the backward reads are in the stash now, the same buffers: counted
    // once (released first, so the peak never holds them twice).
    meter.sub(bytes_of(got));
    meter.add(kept_bytes(st, keep));
    if (!st.loss.empty()) record_loss(ins, read_float(*context_, keep.at(st.loss)));
  } else if (run_.options.forward_only) {
    // An evaluation: the model in eval mode, no state update, no random draw.
    outs = st.program.run(*context_, args, arena_->base(), &hook_,
                          TrainingRun{.update_state = false, .random_key = 0, .eval_mode = true});
    if (!st.loss.empty()) record_loss(ins, read_float(*context_, outs.at(loss_output(st))));
  } else {
    outs = st.program.run(*context_, args, arena_->base(), &hook_, program_run(ins, false));
  }
  timed(schedule::Op::kForward, ins.stage, ins.microbatch, start);
  // The outputs (outside the arena) until they are sent or handed back, but those in the stash
  // (counted there). They exist before the inputs are released.
  const int64_t held = held_output_bytes(st, key, outs);
  meter.add(held);
  if (!training) meter.sub(bytes_of(got));
  for (size_t k : st.graph_outputs)
    run_.results[st.program.outputs()[k].name][batch_index(ins.microbatch)] =
        to_host(*context_, outs[k]);
  if (!st.sends.empty())
    produced_[key] = std::move(outs);
  else
    meter.sub(held);  // handed back: the caller's copies are host memory, not the device's
}

size_t DeviceWorker::loss_output(const StageRuntime& st) {
  const auto& names = st.program.outputs();
  return static_cast<size_t>(
      std::find_if(names.begin(), names.end(),
                   [&](const ValueInfo& v) { return v.name == st.loss; }) -
      names.begin());
}

// Bytes of a forward's outputs that the stash does not hold (metered while they wait to be sent).
int64_t DeviceWorker::held_output_bytes(const StageRuntime& st, const Key& key,
                                        const std::vector<Tensor>& outs) const {
  const auto stash =
      keeps_for_backward() && !st.stage->recompute ? stash_.find(key) : stash_.end();
  int64_t held = 0;
  for (size_t k = 0; k < outs.size(); ++k)
    if (stash == stash_.end() || !stash->second.count(st.program.outputs()[k].name))
      held += outs[k].bytes();
  return held;
}

void DeviceWorker::send_act(const schedule::Instruction& ins) {
  const double start = run_.seconds();
  StageRuntime& st = stage(ins.stage);
  auto it = produced_.find({ins.stage, ins.microbatch});
  if (it == produced_.end() && !st.sends.empty())
    fail(ErrorKind::kPlan, "nothing to send: the forward has not run");
  if (it == produced_.end()) return waited(ins, start);
  const auto& outs = it->second;
  context_->synchronize();  // the receivers read what the forward wrote
  // In the link's buffer the bytes are the receiver's (the transport's on_delivered adds them
  // there), so this device stops counting them before it hands them over: released after the
  // send, a sender the scheduler held back between the two counted them while the receiver ran
  // ahead and sent gradients back into its memory (a peak over the plan's by one message).
  run_.meters[device_].sub(held_output_bytes(st, it->first, outs));
  for (const auto& [to, indices] : st.sends) {
    Message m{ins.microbatch, {}};
    for (size_t k : indices) m.tensors.push_back({st.program.outputs()[k].name, outs[k]});
    transport().send({ins.stage, to, false}, std::move(m));
  }
  produced_.erase(it);
  waited(ins, start);
}

void DeviceWorker::recv_grad(const schedule::Instruction& ins) {
  const double start = run_.seconds();
  auto& slot = grads_in_[{ins.stage, ins.microbatch}];
  for (const auto& [from, indices] : stage(ins.stage).sends) {
    Message m = transport().recv({from, ins.stage, true}, ins.microbatch);
    for (NamedTensor& t : m.tensors) {
      t.tensor = context_->adopt(t.tensor);
      // A tensor read by several later stages: its gradient is the sum of theirs.
      auto same = std::find_if(slot.begin(), slot.end(),
                               [&](const NamedTensor& x) { return x.name == t.name; });
      if (same == slot.end()) {
        slot.push_back(std::move(t));
        continue;
      }
      Tensor sum = clone_on(*context_, same->tensor);
      context_->accumulate(sum, t.tensor);
      same->tensor = sum;
    }
  }
  waited(ins, start);
}

void DeviceWorker::backward(const schedule::Instruction& ins) { run_backward(ins); }

void DeviceWorker::backward_input(const schedule::Instruction& ins) { run_backward(ins); }

void DeviceWorker::backward_weight(const schedule::Instruction& ins) { run_backward(ins); }

// Rebuilds a recomputing stage's stash: the forward again, from the inputs kept for it.
void DeviceWorker::rebuild_stash(const schedule::Instruction& ins, StageRuntime& st) {
  const Key key{ins.stage, ins.microbatch};
  Recompute& rc = recompute_.at(key);
  double start = run_.seconds();
  auto& keep = stash_[key];
  // The running statistics were updated by the microbatch's forward: not again; the random
  // draws (Dropout's mask) are the forward's again.
  st.program.run_keeping(*context_, rc.args, keep, st.stash, arena_->base(), &hook_,
                         program_run(ins, false));
  share_step_copies(ins.stage, st, keep);
  // The inputs are metered already (as received).
  rc.stash_bytes = kept_bytes(st, keep);
  for (const ValueInfo& in : st.program.inputs())
    if (auto k = keep.find(in.name); k != keep.end() && !st.weights.count(in.name))
      rc.stash_bytes -= k->second.bytes();
  run_.meters[device_].add(rc.stash_bytes);
  timed(schedule::Op::kForward, ins.stage, ins.microbatch, start);
}

// The backward's inputs: forward values and weights (the stash), received gradients, the loss
// seed.
std::vector<Tensor> DeviceWorker::backward_args(const schedule::Instruction& ins,
                                                const StageRuntime& st) {
  const Key key{ins.stage, ins.microbatch};
  auto& keep = stash_.at(key);
  std::vector<NamedTensor>& got = grads_in_[key];
  std::vector<Tensor> args;
  for (const ValueInfo& in : st.backward->inputs()) {
    if (in.name == grad::kLossGradName) {
      // 1 / (R x M): the step's gradient is the mean over every replica's microbatches, as
      // one device running all R x M of them would seed it; ALLREDUCE then sums the replicas.
      // With dynamic loss scaling, S times that (OPT_STEP divides the gradients by S).
      const double scale = run_.scales_loss ? run_.pipeline.loss_scale.scale : 1.0;
      args.push_back(scalar_on(
          *context_, static_cast<float>(scale / (run_.microbatches * run_.replicas))));
    } else if (auto k = keep.find(in.name); k != keep.end()) {
      args.push_back(k->second);
    } else if (auto g = std::find_if(got.begin(), got.end(),
                                     [&](const NamedTensor& t) { return t.name == in.name; });
               g != got.end()) {
      args.push_back(g->tensor);
    } else if (!st.stash.count(in.name) && !grad::is_grad_name(in.name)) {
      // A forward value the backward reads for its shape alone: bare, no bytes.
      args.push_back(Tensor::bare(in.dtype, in.shape));
    } else {
      fail(ErrorKind::kPlan,
           "backward input '{}' of stage {} is neither a forward value nor a received gradient",
           in.name, ins.stage);
    }
  }
  return args;
}

void DeviceWorker::run_backward(const schedule::Instruction& ins) {
  StageRuntime& st = stage(ins.stage);
  const Key key{ins.stage, ins.microbatch};
  const Program& bwd = *st.backward;
  if (st.stage->recompute && !stash_.count(key)) rebuild_stash(ins, st);
  std::vector<Tensor> args = backward_args(ins, st);
  double start = run_.seconds();
  auto& bkeep = bwd_kept_[key];
  // The stage's last weight gradients of the step: each bucket's sum starts as soon as the
  // nodes computing its gradients have run.
  auto buckets = grad_buckets_.find(ins.stage);
  const bool last = buckets != grad_buckets_.end() && ins.op != schedule::Op::kBackwardInput &&
                    index_ == buckets->second.last_weight_gradient;
  NodeHook hook = hook_;
  if (last && run_.options.overlap_allreduce)
    hook.output_ready = [&](size_t k, const Tensor& value) {
      const std::string& name = bwd.outputs()[k].name;
      const std::string weight = grad::value_of_grad(name);
      if (value.dtype != DType::kUndefined && buckets->second.bucket_of.count(weight))
        gradient_final(ins.stage, weight, value);
    };
  std::vector<Tensor> outs;
  if (ins.op == schedule::Op::kBackward) {
    outs = bwd.run(*context_, args, arena_->base(), &hook);
  } else {
    const bool weight_part = ins.op == schedule::Op::kBackwardWeight;
    std::vector<bool> mask = st.weight_part;
    if (!weight_part) mask.flip();
    outs = bwd.run_subset(*context_, args, bkeep, mask, arena_->base(), &hook);
    // B's values that W reads wait for it.
    if (!weight_part) run_.meters[device_].add(kept_bytes(st, bkeep));
  }
  timed(ins.op, ins.stage, ins.microbatch, start);
  if (ins.op == schedule::Op::kBackwardInput && st.stage->recompute) {
    // Zero-bubble schedules run W later, after other microbatches' B: drop the rebuilt values
    // (W rebuilds them again) so one microbatch's stay at most.
    Recompute& rc = recompute_.at(key);
    run_.meters[device_].sub(rc.stash_bytes);
    rc.stash_bytes = 0;
    stash_.erase(key);
  }
  take_backward_outputs(ins, st, outs);
  if (last) {
    buckets->second.taken.clear();
    // The buckets whose gradients no node gave during the run (passed through, or none).
    if (run_.options.overlap_allreduce)
      for (size_t b = 0; b < buckets->second.buckets.size(); ++b)
        if (!buckets->second.buckets[b].started) start_bucket(ins.stage, b);
  }
  if (ins.op != schedule::Op::kBackwardInput) free_microbatch(key, st);
}

// Weight gradients add up over the step's microbatches; input gradients go back.
void DeviceWorker::take_backward_outputs(const schedule::Instruction& ins, StageRuntime& st,
                                         std::vector<Tensor>& outs) {
  const Program& bwd = *st.backward;
  for (size_t k = 0; k < outs.size(); ++k) {
    const std::string& name = bwd.outputs()[k].name;
    if (outs[k].dtype == DType::kUndefined) continue;
    std::string weight = grad::value_of_grad(name);
    if (st.weights.count(weight)) {
      if (ins.op == schedule::Op::kBackwardInput) continue;  // W's, not B's
      if (auto b = grad_buckets_.find(ins.stage); b != grad_buckets_.end()) {
        const std::vector<std::string>& taken = b->second.taken;
        if (std::find(taken.begin(), taken.end(), weight) != taken.end())
          continue;  // added up already, as soon as it was final (gradient_final)
      }
      Tensor& acc = grad_acc_[ins.stage][weight];
      if (acc.dtype == DType::kUndefined) {
        acc = context_->new_tensor(outs[k].dtype, outs[k].shape, true);
        run_.meters[device_].add(acc.bytes());  // the gradient buffer lives for the run
      }
      context_->accumulate(acc, outs[k]);
    } else if (ins.op != schedule::Op::kBackwardWeight) {
      grads_out_[{ins.stage, ins.microbatch}].push_back({weight, outs[k]});
    }
  }
}

// The microbatch's backward is done: its forward values, B's kept values and the received
// output gradients go.
void DeviceWorker::free_microbatch(const Key& key, const StageRuntime& st) {
  MemoryMeter& meter = run_.meters[device_];
  if (auto rc = recompute_.find(key); rc != recompute_.end()) {
    meter.sub(rc->second.stash_bytes + rc->second.input_bytes);
    recompute_.erase(rc);
  } else {
    meter.sub(kept_bytes(st, stash_.at(key)));
  }
  stash_.erase(key);
  meter.sub(kept_bytes(st, bwd_kept_[key]));
  bwd_kept_.erase(key);
  meter.sub(bytes_of(grads_in_[key]));  // received output gradients
  grads_in_.erase(key);
}

void DeviceWorker::send_grad(const schedule::Instruction& ins) {
  const double start = run_.seconds();
  const StageRuntime& st = stage(ins.stage);
  const Key key{ins.stage, ins.microbatch};
  std::vector<NamedTensor> grads = std::move(grads_out_[key]);
  grads_out_.erase(key);
  context_->synchronize();  // the receivers read what the backward wrote
  // One message to every producer stage: the gradients of the tensors it sent.
  for (int to : st.producers) {
    Message m{ins.microbatch, {}};
    for (const plan::StageTensor& in : st.stage->inputs) {
      if (in.peer_stage != to) continue;
      for (const NamedTensor& g : grads)
        if (g.name == in.name) m.tensors.push_back({grad::grad_name(in.name), g.tensor});
    }
    transport().send({ins.stage, to, true}, std::move(m));
  }
  waited(ins, start);
}

void DeviceWorker::plan_buckets() {
  const std::vector<schedule::Instruction>& list =
      run_.pipeline.schedule[static_cast<size_t>(pipeline_device_)];
  const int64_t limit = run_.options.bucket_bytes;
  if (limit <= 0)
    fail(ErrorKind::kUsage, "the gradient bucket must hold at least one byte, not {}", limit);
  for (StageRuntime* st : own_stages()) {
    StageBuckets& sb = grad_buckets_[st->stage->index];
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].stage == st->stage->index && (list[i].op == schedule::Op::kBackward ||
                                                list[i].op == schedule::Op::kBackwardWeight))
        sb.last_weight_gradient = i;
    // From the end of the flat layout: whole weights, at most `limit` bytes a bucket (one
    // larger weight alone), never across ZeRO-1's sharded and shared parts.
    for (size_t end = st->flat.size(); end > 0;) {
      GradBucket bucket;
      bucket.last = end;
      bucket.first = end - 1;
      bucket.sharded = st->is_sharded(st->flat[bucket.first]);
      int64_t bytes = 4 * st->flat[bucket.first].elements;
      while (bucket.first > 0) {
        const StageRuntime::FlatWeight& w = st->flat[bucket.first - 1];
        if (st->is_sharded(w) != bucket.sharded || bytes + 4 * w.elements > limit) break;
        bytes += 4 * w.elements;
        --bucket.first;
      }
      bucket.lo = st->flat[bucket.first].offset;
      bucket.hi = bucket.lo + bytes / 4;
      if (bucket.sharded)
        for (int64_t bound : st->shard_bounds)
          bucket.bounds.push_back(std::clamp(bound, bucket.lo, bucket.hi) - bucket.lo);
      bucket.waiting = bucket.last - bucket.first;
      for (size_t j = bucket.first; j < bucket.last; ++j)
        sb.bucket_of[st->flat[j].name] = sb.buckets.size();
      sb.buckets.push_back(std::move(bucket));
      end = sb.buckets.back().first;
    }
  }
}

Tensor& DeviceWorker::gradient_of(int stage_index, const std::string& weight) {
  Tensor& g = grad_acc_[stage_index][weight];
  if (g.dtype == DType::kUndefined) {
    const Tensor& w = stage(stage_index).weights.at(weight);
    g = context_->new_tensor(w.dtype, w.shape, true);
    run_.meters[device_].add(g.bytes());  // the gradient buffer lives for the run
  }
  return g;
}

Tensor& DeviceWorker::flat_bucket(int stage_index) {
  const int64_t elements = stage(stage_index).flat_elements;
  Tensor& bucket = buckets_[stage_index];
  if (bucket.dtype == DType::kUndefined || bucket.numel() != elements) {
    if (bucket.dtype != DType::kUndefined) run_.meters[device_].sub(bucket.bytes());
    bucket = context_->new_tensor(DType::kFloat32, {elements}, false);
    run_.meters[device_].add(bucket.bytes());  // kept for the run, as the plan counts it
  }
  return bucket;
}

void DeviceWorker::gradient_final(int stage_index, const std::string& weight,
                                  const Tensor& value) {
  StageBuckets& sb = grad_buckets_.at(stage_index);
  context_->accumulate(gradient_of(stage_index, weight), value);
  sb.taken.push_back(weight);
  GradBucket& bucket = sb.buckets[sb.bucket_of.at(weight)];
  if (--bucket.waiting == 0) start_bucket(stage_index, sb.bucket_of.at(weight));
}

void DeviceWorker::start_bucket(int stage_index, size_t b) {
  StageRuntime& st = stage(stage_index);
  GradBucket& bucket = grad_buckets_.at(stage_index).buckets[b];
  Tensor& flat = flat_bucket(stage_index);
  // Every weight's gradient as the flat layout places it: the same in every replica (a weight
  // whose gradient no backward of this step gave sums zeros).
  for (size_t j = bucket.first; j < bucket.last; ++j) {
    const StageRuntime::FlatWeight& part = st.flat[j];
    const Tensor& g = gradient_of(stage_index, part.name);
    if (g.dtype != DType::kFloat32)
      fail(ErrorKind::kUnsupported, "the all-reduce sums float32 gradients; '{}' is {}", part.name,
           g.describe());
    Tensor view = Tensor::view(DType::kFloat32, g.shape, flat.data + part.offset * 4);
    context_->copy(g, view);
  }
  transport().start_replica_sum(
      {stage_index, static_cast<int>(b)},
      bucket.sharded ? ReplicaOp::kReduceScatter : ReplicaOp::kAllReduce,
      slice_rows(flat, bucket.lo, bucket.hi), bucket.bounds, *context_);
  bucket.started = true;
  ++sums_in_flight_;
}

void DeviceWorker::progress_sums() {
  for (const auto& [stage_index, sb] : grad_buckets_)
    for (const GradBucket& bucket : sb.buckets)
      if (bucket.started) {
        transport().progress_replicas(stage_index, *context_);
        break;
      }
}

void DeviceWorker::allreduce(const schedule::Instruction& ins) {
  if (!run_.training)
    fail(ErrorKind::kPlan, "{} in an inference plan", schedule::to_string(ins.op));
  const double start = run_.seconds();
  StageRuntime& st = stage(ins.stage);
  StageBuckets& sb = grad_buckets_.at(ins.stage);
  // Buckets not started yet (--no-overlap; a stage whose backward did not run its last
  // weight gradients here) start now.
  for (size_t b = 0; b < sb.buckets.size(); ++b)
    if (!sb.buckets[b].started) start_bucket(ins.stage, b);
  Tensor& flat = flat_bucket(ins.stage);
  for (size_t b = 0; b < sb.buckets.size(); ++b) {
    GradBucket& bucket = sb.buckets[b];
    transport().finish_replica_sum({ins.stage, static_cast<int>(b)}, *context_);
    --sums_in_flight_;
    // Summed whole: back into the gradients. ZeRO-1's reduce-scatter leaves this replica's
    // shard summed in the flat bucket, where its optimizer step reads it.
    if (!bucket.sharded)
      for (size_t j = bucket.first; j < bucket.last; ++j) {
        const StageRuntime::FlatWeight& part = st.flat[j];
        Tensor& g = grad_acc_[ins.stage].at(part.name);
        context_->copy(Tensor::view(DType::kFloat32, g.shape, flat.data + part.offset * 4), g);
      }
    bucket.started = false;  // the next step's
    bucket.waiting = bucket.last - bucket.first;
  }
  // Communication, not compute: the time waited for the sums (what went on behind compute is
  // the backward's) on the timeline, not in the busy time.
  const double end = run_.seconds();
  run_.allreduce[device_][step_] += end - start;
  if (tracing()) run_.events[device_].push_back({device_, ins.op, ins.stage, -1, start, end});
}

}  // namespace stagecraft::rt
