#include "runtime/exec/pipeline.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/format/json_reader.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/optim/optimizer.h"

namespace stagecraft::rt {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

/// One stage as the runtime holds it.
struct Pipeline::StageRuntime {
  const plan::Stage* stage = nullptr;
  Program program;
  std::vector<int> producers;                ///< Stages this one receives from, ascending.
  std::map<int, std::vector<size_t>> sends;  ///< Consumer stage -> indices into program outputs.
  std::vector<size_t> graph_outputs;         ///< Indices into program outputs.
  // Training.
  std::optional<Program> backward;        ///< The stage's backward program.
  std::vector<bool> weight_part;          ///< Per backward node: part of W (zero-bubble).
  std::map<std::string, Tensor> weights;  ///< The forward program's weights (shared bytes).
  std::string loss;                       ///< The loss output's name when this stage computes it.
  std::map<std::string, optim::OptimizerState>
      opt_state;  ///< Per weight; only its device's worker.
};

namespace {

std::string describe(DType dtype, const Shape& shape) {
  return fmt::format("{}{}", dtype_name(dtype), shape_string(shape));
}

DType plan_dtype(const plan::StageTensor& t, const std::string& where) {
  auto dtype = dtype_from_name(t.dtype);
  if (!dtype) fail(ErrorKind::kPlan, "{}: dtype '{}' is unknown", where, t.dtype);
  return *dtype;
}

// Checks that a stage file's inputs or outputs are the ones plan.json lists.
void match_interface(const std::vector<ValueInfo>& in_file,
                     const std::vector<plan::StageTensor>& in_plan, const std::string& file,
                     const std::string& field) {
  for (size_t k = 0; k < in_plan.size(); ++k) {
    const plan::StageTensor& t = in_plan[k];
    std::string where = fmt::format("plan.json: {}[{}] ('{}')", field, k, t.name);
    auto it = std::find_if(in_file.begin(), in_file.end(),
                           [&](const ValueInfo& v) { return v.name == t.name; });
    if (it == in_file.end())
      fail(ErrorKind::kPlan, "{} is not among the {} of {}", where,
           field.substr(field.rfind('.') + 1), file);
    DType dtype = plan_dtype(t, where);
    if (it->dtype != dtype || it->shape != Shape(t.shape.begin(), t.shape.end()))
      fail(ErrorKind::kPlan, "{} is {} but {} has {}", where,
           describe(dtype, Shape(t.shape.begin(), t.shape.end())), file,
           describe(it->dtype, it->shape));
  }
  if (in_file.size() != in_plan.size())
    fail(ErrorKind::kPlan, "{} has {} {} but plan.json's {} lists {}", file, in_file.size(),
         field.substr(field.rfind('.') + 1), field, in_plan.size());
}

// Bytes held by one device, at the highest.
struct MemoryMeter {
  std::atomic<int64_t> current{0}, peak{0};
  void add(int64_t bytes) {
    int64_t now = current.fetch_add(bytes) + bytes;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  void sub(int64_t bytes) { current.fetch_sub(bytes); }
};

// Bytes of a stash, less the weights it refers to (counted once, as the device's weights).
int64_t bytes_of_map(const std::map<std::string, Tensor>& values,
                     const std::map<std::string, Tensor>& weights) {
  int64_t total = 0;
  for (const auto& [name, t] : values)
    if (!weights.count(name)) total += t.bytes();
  return total;
}

int64_t bytes_of(const std::vector<NamedTensor>& tensors) {
  int64_t total = 0;
  for (const NamedTensor& t : tensors) total += t.tensor.bytes();
  return total;
}

}  // namespace

void Pipeline::check_shared_weights(const Pipeline& p, const std::string& plan_json) {
  // Every holder's stage file holds the weight as plan.json says.
  for (const auto& rt : p.stages_) {
    const plan::Stage& stage = *rt->stage;
    for (size_t i = 0; i < stage.shared_weights.size(); ++i) {
      const plan::SharedWeight& w = stage.shared_weights[i];
      std::string field = fmt::format("stages[{}].shared_weights[{}]", stage.index, i);
      auto it = rt->weights.find(w.name);
      if (it == rt->weights.end())
        fail(ErrorKind::kPlan, "{}: {} names weight '{}', which {} does not hold", plan_json, field,
             w.name, stage.file);
      Shape shape(w.shape.begin(), w.shape.end());
      DType dtype = dtype_from_name(w.dtype).value_or(DType::kUndefined);
      if (it->second.dtype != dtype || it->second.shape != shape)
        fail(ErrorKind::kPlan, "{}: {} ('{}') is {} but {} holds {}", plan_json, field, w.name,
             describe(dtype, shape), stage.file, it->second.describe());
    }
  }
  if (!p.plan_.training) return;
  // A weight that two stages train must be summed across them, or their copies drift apart.
  std::map<std::string, int> trained_by;
  for (const auto& rt : p.stages_) {
    for (const ValueInfo& out : rt->backward->outputs()) {
      if (!out.name.ends_with("@grad")) continue;
      std::string weight = out.name.substr(0, out.name.size() - 5);
      if (!rt->weights.count(weight)) continue;
      auto [first, fresh] = trained_by.emplace(weight, rt->stage->index);
      if (fresh) continue;
      const auto& shared = rt->stage->shared_weights;
      if (std::none_of(shared.begin(), shared.end(),
                       [&](const plan::SharedWeight& w) { return w.name == weight; }))
        fail(ErrorKind::kPlan,
             "{}: stages[{}] and stages[{}] both train weight '{}', but stages[{}].shared_weights "
             "does not list it (their copies would drift apart)",
             plan_json, first->second, rt->stage->index, weight, rt->stage->index);
    }
  }
}

std::unique_ptr<Pipeline> Pipeline::load(const std::string& plan_dir, const Backend& backend,
                                         int threads_per_device) {
  if (threads_per_device < 1)
    fail(ErrorKind::kUsage, "--threads-per-device must be at least 1 (got {})", threads_per_device);
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->plan_dir_ = plan_dir;
  p->backend_ = &backend;
  p->threads_per_device_ = threads_per_device;
  p->plan_ = plan::load_plan(plan_dir);
  const plan::Plan& plan = p->plan_;
  std::string plan_json = (fs::path(plan_dir) / "plan.json").string();
  if (plan.training)
    for (const plan::Stage& stage : plan.stages)
      if (stage.backward_file.empty())
        fail(ErrorKind::kPlan, "{}: stages[{}] of a training plan has no backward_file", plan_json,
             stage.index);
  for (const plan::Stage& stage : plan.stages)
    if (stage.file.empty() || stage.file_hash.empty())
      fail(ErrorKind::kPlan, "{}: stages[{}] has no stage file (a --dry-run plan cannot run)",
           plan_json, stage.index);

  p->shape_ = {plan.devices, plan.chunks, plan.microbatches, plan.training};
  p->shape_.shared_groups = plan::shared_weight_groups(plan);
  std::string schedule_path = (fs::path(plan_dir) / "schedule.json").string();
  nlohmann::json body = read_json_file(schedule_path);
  p->schedule_ = with_context(plan_dir, ErrorKind::kFormat,
                              [&] { return schedule::schedule_from_json(body); });
  with_context(schedule_path, ErrorKind::kPlan,
               [&] { schedule::validate_schedule(p->schedule_, p->shape_); });

  std::map<std::string, ModelTensor> model_inputs;
  for (const plan::Stage& stage : plan.stages) {
    auto rt = std::make_shared<StageRuntime>();
    rt->stage = &stage;
    std::string file = (fs::path(plan_dir) / stage.file).string();
    std::string field = fmt::format("stages[{}]", stage.index);
    rt->program = Program::load_file(
        file, backend, Program::RecordedArena{&stage, "plan.json: " + field + ".arena"});
    match_interface(rt->program.inputs(), stage.inputs, file, field + ".inputs");
    match_interface(rt->program.outputs(), stage.outputs, file, field + ".outputs");
    if (plan.training) {
      std::string bwd = (fs::path(plan_dir) / stage.backward_file).string();
      rt->backward.emplace(Program::load_file(bwd, backend));
      // The plan's memory prediction counts the backward's arena: it must be the one we run.
      if (stage.backward_arena_bytes > 0 && rt->backward->arena_bytes() != stage.backward_arena_bytes)
        fail(ErrorKind::kPlan,
             "{}: {}.backward_arena_bytes is {} but the backward file needs an arena of {} bytes",
             plan_json, field, stage.backward_arena_bytes, rt->backward->arena_bytes());
      rt->weight_part = rt->backward->weight_gradient_nodes();
      for (const ValueInfo& out : rt->program.outputs())
        if (out.name == plan.training_config.loss_output) rt->loss = out.name;
    }
    rt->weights = rt->program.weights();
    std::set<int> producers;
    for (const plan::StageTensor& in : stage.inputs) {
      if (in.peer_stage >= 0) {
        producers.insert(in.peer_stage);
        continue;
      }
      ModelTensor t{in.name, plan_dtype(in, field), Shape(in.shape.begin(), in.shape.end())};
      auto [it, fresh] = model_inputs.emplace(in.name, t);
      if (!fresh && (it->second.dtype != t.dtype || it->second.shape != t.shape))
        fail(ErrorKind::kPlan, "{}: graph input '{}' has different types in two stages", plan_json,
             in.name);
    }
    rt->producers.assign(producers.begin(), producers.end());
    const auto& outs = rt->program.outputs();
    for (const plan::StageTensor& out : stage.outputs) {
      size_t index =
          static_cast<size_t>(std::find_if(outs.begin(), outs.end(),
                                           [&](const ValueInfo& v) { return v.name == out.name; }) -
                              outs.begin());
      for (int peer : out.peer_stages) {
        rt->sends[peer].push_back(index);
        p->links_.push_back({stage.index, peer, false});
        if (plan.training) p->links_.push_back({peer, stage.index, true});
      }
      if (out.graph_output) {
        rt->graph_outputs.push_back(index);
        p->outputs_.push_back(
            {out.name, plan_dtype(out, field), Shape(out.shape.begin(), out.shape.end())});
      }
    }
    p->stages_.push_back(std::move(rt));
  }
  for (auto& [name, t] : model_inputs) p->inputs_.push_back(t);
  check_shared_weights(*p, plan_json);
  std::sort(p->links_.begin(), p->links_.end());
  p->links_.erase(std::unique(p->links_.begin(), p->links_.end()), p->links_.end());
  return p;
}

void Pipeline::check_inputs(const std::map<std::string, Tensor>& inputs) const {
  for (const ModelTensor& in : inputs_) {
    auto it = inputs.find(in.name);
    if (it == inputs.end())
      fail(ErrorKind::kUsage, "input '{}' ({}) is not given", in.name,
           describe(in.dtype, in.shape));
    const Tensor& t = it->second;
    Shape batch = in.shape;
    if (!batch.empty()) batch[0] *= plan_.microbatches;
    if (t.dtype != in.dtype || (t.shape != batch && t.shape != in.shape))
      fail(ErrorKind::kShape,
           "input '{}' is {} but the plan takes {} (the batch of {} microbatches) or {} (one "
           "microbatch, given to each)",
           in.name, t.describe(), describe(in.dtype, batch), plan_.microbatches,
           describe(in.dtype, in.shape));
  }
  for (const auto& [name, t] : inputs)
    if (std::none_of(inputs_.begin(), inputs_.end(),
                     [&](const ModelTensor& m) { return m.name == name; }))
      fail(ErrorKind::kUsage, "input '{}' is not an input of the model (its inputs: {})", name,
           fmt::join(
               [&] {
                 std::vector<std::string> names;
                 for (const ModelTensor& m : inputs_) names.push_back(m.name);
                 return names;
               }(),
               ", "));
}

std::map<std::string, Tensor> Pipeline::synthetic_inputs() const {
  std::map<std::string, Tensor> out;
  std::mt19937 rng(20261121);
  for (const ModelTensor& in : inputs_) {
    Shape batch = in.shape;
    if (!batch.empty()) batch[0] *= plan_.microbatches;
    Tensor t = Tensor::owned(in.dtype, batch);
    int64_t n = t.numel();
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      switch (in.dtype) {
        case DType::kFloat32:
          t.as<float>()[i] = uniform(rng);
          break;
        case DType::kFloat64:
          t.as<double>()[i] = uniform(rng);
          break;
        case DType::kInt64:
          t.as<int64_t>()[i] = static_cast<int64_t>(rng() & 1);
          break;
        case DType::kInt32:
          t.as<int32_t>()[i] = static_cast<int32_t>(rng() & 1);
          break;
        case DType::kBool:
        case DType::kUInt8:
          t.as<uint8_t>()[i] = static_cast<uint8_t>(i & 1);
          break;
        default:
          break;  // left at zero
      }
    }
    out[in.name] = std::move(t);
  }
  return out;
}

RunReport Pipeline::run(const std::map<std::string, Tensor>& inputs, const RunOptions& options) {
  check_inputs(inputs);
  if (options.steps < 1)
    fail(ErrorKind::kUsage, "--steps must be at least 1 (got {})", options.steps);
  const int devices = plan_.devices, M = plan_.microbatches, steps = options.steps;

  // Microbatch views of the inputs (no copies).
  std::map<std::string, std::vector<Tensor>> feeds;
  for (const ModelTensor& in : inputs_) {
    const Tensor& whole = inputs.at(in.name);
    for (int mb = 0; mb < M; ++mb)
      feeds[in.name].push_back(whole.shape == in.shape
                                   ? whole
                                   : slice_rows(whole, mb * in.shape[0], (mb + 1) * in.shape[0]));
  }
  std::map<std::string, std::vector<Tensor>> results;
  for (const ModelTensor& out : outputs_) results[out.name].resize(M);

  const bool training = plan_.training;
  const plan::TrainingConfig& tc = plan_.training_config;
  std::unique_ptr<optim::Optimizer> optimizer;
  optim::LrSchedule lr_schedule;
  if (training) {
    optim::OptimizerConfig oc;
    oc.kind = plan_.optimizer;
    oc.lr = static_cast<float>(tc.lr);
    oc.weight_decay = static_cast<float>(tc.weight_decay);
    oc.momentum = static_cast<float>(tc.momentum);
    oc.beta1 = static_cast<float>(tc.beta1);
    oc.beta2 = static_cast<float>(tc.beta2);
    oc.epsilon = static_cast<float>(tc.epsilon);
    optimizer = optim::Optimizer::make(oc);
    lr_schedule.kind = optim::parse_lr_schedule(tc.lr_schedule);
    lr_schedule.base_lr = tc.lr;
    lr_schedule.warmup_steps = tc.warmup_steps;
    lr_schedule.total_steps = tc.total_steps;
    optim::validate(lr_schedule);
  }
  const int64_t global_step = steps_done_;
  std::vector<std::vector<double>> step_loss(steps, std::vector<double>(M, NAN));

  // Inference: a link holds one message, so a stage that runs ahead waits instead of queueing
  // microbatches on the next device (whose memory the plan counts with two receive buffers:
  // the one computing and the one arriving). Training schedules send up to M ahead.
  std::vector<MemoryMeter> meters(devices);
  InProcessTransport transport(
      links_, plan_.training ? M : 1, [&](const Link& link, const Message& m) {
        meters[stages_[link.to_stage]->stage->device].add(bytes_of(m.tensors));
      });
  StepBarrier barrier(devices);
  std::mutex error_mutex;
  std::optional<Error> first_error;
  std::vector<DeviceReport> reports(devices);
  std::vector<std::vector<double>> busy(devices, std::vector<double>(steps, 0.0));
  std::vector<std::vector<schedule::TimelineEvent>> events(devices);
  std::vector<double> step_start(steps, 0), step_end(steps, 0);
  const Clock::time_point t0 = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  auto stop_all = [&](Error error) {
    {
      std::lock_guard lock(error_mutex);
      if (!first_error) first_error = std::move(error);
    }
    transport.abort();
    barrier.abort();
  };

  NodeHook hook;
  if (!options.inject_fault.empty())
    hook.before = [&](std::string_view node, std::string_view) {
      if (node == options.inject_fault)
        fail(ErrorKind::kInternal, "fault injected at node '{}' (test hook)", node);
    };

  auto worker = [&](int device) {
    std::string where = fmt::format("device {}", device);
    try {
      omp_set_num_threads(threads_per_device_);
      auto context = backend_->make_device(device, threads_per_device_);
      int64_t arena_bytes = 0, weight_bytes = 0;
      for (const auto& st : stages_)
        if (st->stage->device == device) {
          // Training keeps every forward value for the backward: no arena reuse, except for a
          // stage that recomputes (its first forward keeps nothing but its inputs). The
          // backward runs in the arena (never at the same time as a forward).
          if (!training || st->stage->recompute)
            arena_bytes = std::max(arena_bytes, st->program.arena_bytes());
          if (training) arena_bytes = std::max(arena_bytes, st->backward->arena_bytes());
          weight_bytes += st->program.weight_bytes();
        }
      // One arena per device: its stages run one at a time, so the largest plan serves all.
      std::unique_ptr<std::byte[], void (*)(std::byte*)> arena(
          static_cast<std::byte*>(std::aligned_alloc(
              plan::kArenaAlignment, static_cast<size_t>((arena_bytes + 63) / 64 * 64 + 64))),
          [](std::byte* b) { std::free(b); });
      if (!arena) fail(ErrorKind::kIo, "cannot allocate the {}-byte arena", arena_bytes);
      reports[device].arena_bytes = arena_bytes;
      reports[device].weight_bytes = weight_bytes;
      meters[device].add(arena_bytes + weight_bytes);
      for (const auto& st : stages_)  // optimizer state kept from earlier runs or a checkpoint
        if (st->stage->device == device)
          for (const auto& [name, state] : st->opt_state) meters[device].add(state.bytes());

      // Per (stage, microbatch): received tensors waiting for FWD, outputs waiting for SEND.
      std::map<std::pair<int, int>, std::vector<NamedTensor>> received;
      std::map<std::pair<int, int>, std::vector<Tensor>> produced;
      // Training: forward values per microbatch until its backward, received output gradients,
      // the backward's own values (B kept for W), input gradients waiting to be sent, weight
      // gradients summed over the step, optimizer state.
      std::map<std::pair<int, int>, std::map<std::string, Tensor>> stash, bwd_kept;
      // Recomputing stages: per microbatch in flight, the forward's arguments (its inputs) and
      // the metered bytes of them (the received ones) and of the rebuilt stash.
      struct Recompute {
        std::vector<Tensor> args;
        int64_t input_bytes = 0, stash_bytes = 0;
      };
      std::map<std::pair<int, int>, Recompute> recompute;
      std::map<std::pair<int, int>, std::vector<NamedTensor>> grads_in, grads_out;
      std::map<int, std::map<std::string, Tensor>> grad_acc;
      for (int step = 0; step < steps; ++step) {
        barrier.arrive_and_wait();
        if (device == 0) step_start[step] = seconds();
        for (const schedule::Instruction& ins : schedule_[device]) {
          StageRuntime& st = *stages_[ins.stage];
          // The context (device, step, instruction) is built only when something fails.
          try {
            switch (ins.op) {
              case schedule::Op::kRecvAct: {
                auto& slot = received[{ins.stage, ins.microbatch}];
                for (int from : st.producers) {
                  Message m = transport.recv({from, ins.stage, false}, ins.microbatch);
                  for (NamedTensor& t : m.tensors) slot.push_back(std::move(t));
                }
                break;
              }
              case schedule::Op::kForward: {
                auto key = std::make_pair(ins.stage, ins.microbatch);
                std::vector<NamedTensor> got = std::move(received[key]);
                received.erase(key);
                std::vector<Tensor> args;
                for (const ValueInfo& in : st.program.inputs()) {
                  auto it = std::find_if(got.begin(), got.end(),
                                         [&](const NamedTensor& t) { return t.name == in.name; });
                  if (it != got.end())
                    args.push_back(it->tensor);
                  else if (auto f = feeds.find(in.name); f != feeds.end())
                    args.push_back(f->second[ins.microbatch]);
                  else
                    fail(ErrorKind::kPlan, "input '{}' of stage {} was never received", in.name,
                         ins.stage);
                }
                // A microbatch's loss: kept for the step's mean; NaN or Inf stops the run unless
                // told to skip.
                auto record_loss = [&](float loss) {
                  if (!std::isfinite(loss) && !options.skip_nonfinite)
                    fail(ErrorKind::kModel,
                         "the loss is {} at step {}, microbatch {} (stage {}); stopping "
                         "(--skip-nonfinite goes on)",
                         loss, global_step + step + 1, ins.microbatch, ins.stage);
                  step_loss[step][ins.microbatch] = loss;
                };
                double start = seconds();
                std::vector<Tensor> outs;
                if (training && st.stage->recompute) {
                  // Keep the inputs only (the received ones stay metered); the backward
                  // re-runs the forward from them.
                  outs = st.program.run(*context, args, arena.get(), &hook);
                  if (!st.loss.empty()) {
                    const auto& names = st.program.outputs();
                    size_t at = static_cast<size_t>(
                        std::find_if(names.begin(), names.end(),
                                     [&](const ValueInfo& v) { return v.name == st.loss; }) -
                        names.begin());
                    float loss = outs.at(at).as<float>()[0];
                    record_loss(loss);
                  }
                  recompute[key] = Recompute{args, bytes_of(got), 0};
                } else if (training) {
                  auto& keep = stash[key];
                  outs = st.program.run_keeping(*context, args, keep, &hook);
                  meters[device].add(bytes_of_map(keep, st.weights));
                  if (!st.loss.empty()) {
                    float loss = keep.at(st.loss).as<float>()[0];
                    record_loss(loss);
                  }
                } else {
                  outs = st.program.run(*context, args, arena.get(), &hook);
                }
                double end = seconds();
                busy[device][step] += end - start;
                events[device].push_back(
                    {device, schedule::Op::kForward, ins.stage, ins.microbatch, start, end});
                if (!(training && st.stage->recompute)) meters[device].sub(bytes_of(got));
                for (size_t k : st.graph_outputs)
                  results[st.program.outputs()[k].name][ins.microbatch] = outs[k];
                if (!st.sends.empty()) {
                  int64_t held = 0;
                  for (const Tensor& t : outs) held += t.bytes();
                  // Training: already in the stash, unless the stage recomputes.
                  if (!training || st.stage->recompute) meters[device].add(held);
                  produced[key] = std::move(outs);
                }
                break;
              }
              case schedule::Op::kSendAct: {
                auto key = std::make_pair(ins.stage, ins.microbatch);
                auto it = produced.find(key);
                if (it == produced.end() && !st.sends.empty())
                  fail(ErrorKind::kPlan, "nothing to send: the forward has not run");
                if (it == produced.end()) break;
                const auto& outs = it->second;
                for (const auto& [to, indices] : st.sends) {
                  Message m{ins.microbatch, {}};
                  for (size_t k : indices)
                    m.tensors.push_back({st.program.outputs()[k].name, outs[k]});
                  // In the link's buffer the bytes are the receiver's (see on_delivered above).
                  transport.send({ins.stage, to, false}, std::move(m));
                }
                int64_t held = 0;
                for (const Tensor& t : outs) held += t.bytes();
                if (!training || st.stage->recompute) meters[device].sub(held);
                produced.erase(it);
                break;
              }
              case schedule::Op::kRecvGrad: {
                auto& slot = grads_in[{ins.stage, ins.microbatch}];
                for (const auto& [from, indices] : st.sends) {
                  Message m = transport.recv({from, ins.stage, true}, ins.microbatch);
                  for (NamedTensor& t : m.tensors) {
                    // A tensor read by several later stages: its gradient is the sum of theirs.
                    auto same = std::find_if(slot.begin(), slot.end(), [&](const NamedTensor& x) {
                      return x.name == t.name;
                    });
                    if (same == slot.end()) {
                      slot.push_back(std::move(t));
                      continue;
                    }
                    Tensor sum = clone(same->tensor);
                    float* out = sum.as<float>();
                    const float* add = t.tensor.as<float>();
                    for (int64_t i = 0, n = sum.numel(); i < n; ++i) out[i] += add[i];
                    same->tensor = sum;
                  }
                }
                break;
              }
              case schedule::Op::kBackward:
              case schedule::Op::kBackwardInput:
              case schedule::Op::kBackwardWeight: {
                auto key = std::make_pair(ins.stage, ins.microbatch);
                const Program& bwd = *st.backward;
                bool weight_part = ins.op == schedule::Op::kBackwardWeight;
                if (st.stage->recompute && !stash.count(key)) {
                  // Rebuild the stash: the forward again, from the inputs kept for it.
                  Recompute& rc = recompute.at(key);
                  double start = seconds();
                  auto& keep = stash[key];
                  st.program.run_keeping(*context, rc.args, keep, &hook);
                  // The inputs are metered already (as received).
                  rc.stash_bytes = bytes_of_map(keep, st.weights);
                  for (const ValueInfo& in : st.program.inputs())
                    if (auto k = keep.find(in.name); k != keep.end() && !st.weights.count(in.name))
                      rc.stash_bytes -= k->second.bytes();
                  meters[device].add(rc.stash_bytes);
                  double end = seconds();
                  busy[device][step] += end - start;
                  events[device].push_back(
                      {device, schedule::Op::kForward, ins.stage, ins.microbatch, start, end});
                }
                // Inputs: forward values and weights (the stash), received gradients, the loss
                // seed.
                auto& keep = stash.at(key);
                std::vector<NamedTensor>& got = grads_in[key];
                std::vector<Tensor> args;
                for (const ValueInfo& in : bwd.inputs()) {
                  if (in.name == grad::kLossGradName) {
                    Tensor seed = Tensor::owned(DType::kFloat32, {});
                    seed.as<float>()[0] = 1.0f / static_cast<float>(M);
                    args.push_back(seed);
                  } else if (auto k = keep.find(in.name); k != keep.end()) {
                    args.push_back(k->second);
                  } else if (auto g = std::find_if(
                                 got.begin(), got.end(),
                                 [&](const NamedTensor& t) { return t.name == in.name; });
                             g != got.end()) {
                    args.push_back(g->tensor);
                  } else {
                    fail(ErrorKind::kPlan,
                         "backward input '{}' of stage {} is neither a forward value nor a "
                         "received gradient",
                         in.name, ins.stage);
                  }
                }
                double start = seconds();
                auto& bkeep = bwd_kept[key];
                std::vector<Tensor> outs;
                if (ins.op == schedule::Op::kBackward) {
                  outs = bwd.run(*context, args, arena.get(), &hook);
                } else {
                  std::vector<bool> mask = st.weight_part;
                  if (!weight_part) mask.flip();
                  outs = bwd.run_subset(*context, args, bkeep, mask, arena.get(), &hook);
                  // B's values that W reads wait for it.
                  if (!weight_part) meters[device].add(bytes_of_map(bkeep, st.weights));
                }
                double end = seconds();
                busy[device][step] += end - start;
                events[device].push_back({device, ins.op, ins.stage, ins.microbatch, start, end});
                if (ins.op == schedule::Op::kBackwardInput && st.stage->recompute) {
                  // Zero-bubble schedules run W later, after other microbatches' B: drop the
                  // rebuilt values (W rebuilds them again) so one microbatch's stay at most.
                  Recompute& rc = recompute.at(key);
                  meters[device].sub(rc.stash_bytes);
                  rc.stash_bytes = 0;
                  stash.erase(key);
                }
                // Weight gradients add up over the step's microbatches; input gradients go back.
                for (size_t k = 0; k < outs.size(); ++k) {
                  const std::string& name = bwd.outputs()[k].name;
                  if (outs[k].dtype == DType::kUndefined) continue;
                  std::string weight = name.substr(0, name.size() - 5);  // drop "@grad"
                  if (st.weights.count(weight)) {
                    if (ins.op == schedule::Op::kBackwardInput) continue;  // W's, not B's
                    Tensor& acc = grad_acc[ins.stage][weight];
                    if (acc.dtype == DType::kUndefined) {
                      acc = Tensor::owned(outs[k].dtype, outs[k].shape);
                      meters[device].add(acc.bytes());  // the gradient buffer lives for the run
                    }
                    float* a = acc.as<float>();
                    const float* g = outs[k].as<float>();
                    // numel() walks the shape: once, not per element.
                    for (int64_t i = 0, n = acc.numel(); i < n; ++i) a[i] += g[i];
                  } else if (ins.op != schedule::Op::kBackwardWeight) {
                    grads_out[key].push_back({weight, outs[k]});
                  }
                }
                if (ins.op != schedule::Op::kBackwardInput) {
                  if (auto rc = recompute.find(key); rc != recompute.end()) {
                    meters[device].sub(rc->second.stash_bytes + rc->second.input_bytes);
                    recompute.erase(rc);
                  } else {
                    meters[device].sub(bytes_of_map(keep, st.weights));
                  }
                  stash.erase(key);
                  meters[device].sub(bytes_of_map(bkeep, st.weights));
                  bwd_kept.erase(key);
                  meters[device].sub(bytes_of(grads_in[key]));  // received output gradients
                  grads_in.erase(key);
                }
                break;
              }
              case schedule::Op::kSendGrad: {
                auto key = std::make_pair(ins.stage, ins.microbatch);
                std::vector<NamedTensor> grads = std::move(grads_out[key]);
                grads_out.erase(key);
                // One message to every producer stage: the gradients of the tensors it sent.
                for (int to : st.producers) {
                  Message m{ins.microbatch, {}};
                  for (const plan::StageTensor& in : st.stage->inputs) {
                    if (in.peer_stage != to) continue;
                    for (const NamedTensor& g : grads)
                      if (g.name == in.name)
                        m.tensors.push_back({grad::grad_name(in.name), g.tensor});
                  }
                  transport.send({ins.stage, to, true}, std::move(m));
                }
                break;
              }
              case schedule::Op::kAllReduceShared: {
                // The stage's part of each shared weight's gradient (zeros where it computes
                // none: its copy must take the same update as the others).
                for (const plan::SharedWeight& w : st.stage->shared_weights) {
                  Tensor& acc = grad_acc[ins.stage][w.name];
                  if (acc.dtype == DType::kUndefined) {
                    const Tensor& weight = st.weights.at(w.name);
                    acc = Tensor::owned(weight.dtype, weight.shape);
                    meters[device].add(acc.bytes());  // the gradient buffer lives for the run
                  }
                  transport.start_shared_sum(w.name, w.stages, ins.stage, acc);
                  meters[device].add(acc.bytes());  // the transport's copy, until the sum
                }
                break;
              }
              case schedule::Op::kOptimizerStep: {
                // Shared weights: every holder's gradient summed, the same bytes on each.
                for (const plan::SharedWeight& w : st.stage->shared_weights) {
                  Tensor& acc = grad_acc[ins.stage].at(w.name);
                  transport.finish_shared_sum(w.name, ins.stage, acc);
                  meters[device].sub(acc.bytes());
                }
                double start = seconds();
                float lr = static_cast<float>(optim::lr_at(lr_schedule, global_step + step + 1));
                for (auto& [name, weight] : st.weights) {
                  auto g = grad_acc[ins.stage].find(name);
                  if (g == grad_acc[ins.stage].end()) continue;  // not trainable or no gradient
                  int64_t state_before = st.opt_state[name].bytes();
                  optimizer->step(weight, g->second, st.opt_state[name], lr,
                                  global_step + step + 1);
                  meters[device].add(st.opt_state[name].bytes() -
                                     state_before);  // created on first use
                  std::fill(g->second.as<float>(), g->second.as<float>() + g->second.numel(), 0.0f);
                }
                double end = seconds();
                busy[device][step] += end - start;
                events[device].push_back({device, ins.op, ins.stage, -1, start, end});
                break;
              }
              default:
                fail(ErrorKind::kUnsupported,
                     "{} is a training instruction; this runtime runs inference plans",
                     schedule::to_string(ins.op));
            }
          } catch (Error& e) {
            e.in(fmt::format("step {}: {}", global_step + step + 1, schedule::to_string(ins))).in(where);
            throw;
          } catch (const Aborted&) {
            throw;
          } catch (const std::exception& e) {
            throw Error(ErrorKind::kInternal, e.what())
                .in(fmt::format("step {}: {}", global_step + step + 1, schedule::to_string(ins)))
                .in(where);
          }
        }
        barrier.arrive_and_wait();
        if (device == 0) {
          step_end[step] = seconds();
          if (options.progress) options.progress(step + 1, steps, step_end[step]);
        }
        bool checkpoint =
            training && options.checkpoint &&
            (step + 1 == steps || (options.checkpoint_every > 0 &&
                                   (global_step + step + 1) % options.checkpoint_every == 0));
        if (checkpoint) {
          // Device 0 saves while the others wait at the barrier (nothing changes the weights).
          if (device == 0) {
            steps_done_ = global_step + step + 1;
            try {
              options.checkpoint(steps_done_);
            } catch (Error& e) {
              stop_all(std::move(e));
              throw Aborted();
            }
          }
          barrier.arrive_and_wait();
        }
      }
    } catch (const Aborted&) {
      // Another worker failed first; its error is the one reported.
    } catch (Error& e) {
      if (e.context().empty() || e.context().front() != where) e.in(where);
      stop_all(std::move(e));
    } catch (const std::exception& e) {
      stop_all(Error(ErrorKind::kInternal, e.what()).in(where));
    }
  };

  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) threads.emplace_back(worker, d);
  for (std::thread& t : threads) t.join();
  if (first_error) {
    if (training) {
      // Steps that did not finish leave no optimizer step behind in the count (a checkpoint
      // taken during the run recorded its own); keep the count at the last finished step.
      int finished = 0;
      while (finished < steps && step_end[finished] > 0) ++finished;
      steps_done_ = global_step + finished;
    }
    throw *first_error;
  }

  RunReport report;
  steps_done_ = global_step + steps;
  for (int s = 0; s < steps; ++s) report.step_s.push_back(step_end[s] - step_start[s]);
  if (training)
    for (int s = 0; s < steps; ++s) {
      double sum = 0;
      for (double l : step_loss[s]) sum += l;
      report.losses.push_back(sum / M);
    }
  std::vector<int> order(steps);
  for (int s = 0; s < steps; ++s) order[s] = s;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return report.step_s[a] < report.step_s[b]; });
  report.reported_step = order[steps / 2];
  double step = report.step_s[report.reported_step], total_busy = 0;
  for (int d = 0; d < devices; ++d) {
    reports[d].busy_s = busy[d][report.reported_step];
    reports[d].peak_bytes = meters[d].peak.load();
    if (d < static_cast<int>(plan_.predicted.device_peak_bytes.size()))
      reports[d].predicted_peak_bytes = plan_.predicted.device_peak_bytes[d];
    total_busy += reports[d].busy_s;
  }
  report.bubble_fraction = step > 0 ? std::max(0.0, 1.0 - total_busy / (devices * step)) : 0.0;
  report.devices = std::move(reports);
  for (auto& list : events) report.events.insert(report.events.end(), list.begin(), list.end());
  for (auto& [name, parts] : results) report.outputs[name] = concat_rows(parts);
  return report;
}

const std::map<std::string, Tensor>& Pipeline::stage_weights(int stage) const {
  if (stage < 0 || stage >= static_cast<int>(stages_.size()))
    fail(ErrorKind::kInternal, "stage {} is out of range (the plan has {})", stage, stages_.size());
  return stages_[stage]->weights;
}

std::map<std::string, optim::OptimizerState>& Pipeline::optimizer_state(int stage) {
  if (stage < 0 || stage >= static_cast<int>(stages_.size()))
    fail(ErrorKind::kInternal, "stage {} is out of range (the plan has {})", stage, stages_.size());
  return stages_[stage]->opt_state;
}

const std::map<std::string, optim::OptimizerState>& Pipeline::optimizer_state(int stage) const {
  return const_cast<Pipeline*>(this)->optimizer_state(stage);
}

}  // namespace stagecraft::rt
