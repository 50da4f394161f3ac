#include "runtime/exec/pipeline.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "runtime/exec/stage_runtime.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/format/json_reader.h"

namespace stagecraft::rt {

namespace fs = std::filesystem;

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

}  // namespace

void Pipeline::check_shared_weights(const Pipeline& p, const std::string& plan_json) {
  // Every holder's stage file holds the weight as plan.json says.
  const int first_replica = p.local_devices_.front() / p.plan_.devices;
  for (const auto& rt : p.stages_) {
    const plan::Stage& stage = *rt->stage;
    if (rt->replica != first_replica) continue;  // the others load the same files
    if (!p.runs_device(rt->replica * p.plan_.devices + stage.device))
      continue;  // another process checks its own
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
    if (!rt->backward || rt->replica != first_replica) continue;  // another process's stage
    for (const ValueInfo& out : rt->backward->outputs()) {
      if (!grad::is_grad_name(out.name)) continue;
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

void Pipeline::load_programs(const Pipeline& p, StageRuntime& rt) {
  const plan::Stage& stage = *rt.stage;
  const plan::Plan& plan = p.plan_;
  std::string plan_json = plan::plan_file(p.plan_dir_, "plan.json");
  std::string file = plan::plan_file(p.plan_dir_, stage.file);
  std::string field = fmt::format("stages[{}]", stage.index);
  const ExternalWeights external = external_weights_of(plan, stage, p.plan_dir_);
  rt.program = Program::load_file(
      file, *p.backend_, Program::RecordedArena{&stage, "plan.json: " + field + ".arena"},
      &external);
  match_interface(rt.program.inputs(), stage.inputs, file, field + ".inputs");
  match_interface(rt.program.outputs(), stage.outputs, file, field + ".outputs");
  if (plan.training) {
    std::string bwd = plan::plan_file(p.plan_dir_, stage.backward_file);
    rt.backward.emplace(Program::load_file(bwd, *p.backend_));
    // The plan's memory prediction counts the backward's arena: it must be the one we run.
    if (stage.backward_arena_bytes > 0 && rt.backward->arena_bytes() != stage.backward_arena_bytes)
      fail(ErrorKind::kPlan,
           "{}: {}.backward_arena_bytes is {} but the backward file needs an arena of {} bytes",
           plan_json, field, stage.backward_arena_bytes, rt.backward->arena_bytes());
    rt.weight_part = rt.backward->weight_gradient_nodes();
    for (const ValueInfo& out : rt.program.outputs())
      if (out.name == plan.training_config.loss_output) rt.loss = out.name;
    const std::vector<bool> read = rt.backward->inputs_read();
    for (size_t k = 0; k < read.size(); ++k)
      if (read[k]) rt.stash.insert(rt.backward->inputs()[k].name);
    if (!rt.loss.empty()) rt.stash.insert(rt.loss);
    for (const std::string& copy : rt.program.weight_casts())
      if (rt.stash.count(copy)) rt.step_copies.insert(copy);
  }
  rt.weights = rt.program.weights();
  if (plan.training) lay_out_gradients(p, rt);
}

const StageRuntime::FlatWeight* StageRuntime::flat_weight(const std::string& weight) const {
  for (const FlatWeight& w : flat)
    if (w.name == weight) return &w;
  return nullptr;
}

void Pipeline::lay_out_gradients(const Pipeline& p, StageRuntime& rt) {
  const plan::Plan& plan = p.plan_;
  const plan::Stage& stage = *rt.stage;
  const bool zero = plan.shard_optimizer;
  auto trained = [&](const std::string& name) {
    const auto& outputs = rt.backward->outputs();
    return std::any_of(outputs.begin(), outputs.end(),
                       [&](const ValueInfo& out) { return out.name == grad::grad_name(name); });
  };
  auto shared = [&](const std::string& name) {
    return std::any_of(stage.shared_weights.begin(), stage.shared_weights.end(),
                       [&](const plan::SharedWeight& w) { return w.name == name; });
  };
  rt.flat.clear();
  rt.flat_elements = 0;
  // ZeRO-1 shards the weights no other stage holds (first); shared ones are summed whole.
  for (int pass = 0; pass < (zero ? 2 : 1); ++pass) {
    for (const auto& [name, w] : rt.weights) {
      if (!trained(name) || (zero && shared(name) != (pass == 1))) continue;
      rt.flat.push_back({name, rt.flat_elements, w.numel()});
      rt.flat_elements += w.numel();
    }
    if (pass == 0) rt.sharded = rt.flat_elements;
  }
  if (!zero) {
    rt.sharded = 0;
    return;
  }
  const std::vector<int64_t>& bounds = stage.optimizer_shards;
  if (bounds.size() != static_cast<size_t>(plan.data_parallel) + 1 || bounds.back() != rt.sharded)
    fail(ErrorKind::kPlan,
         "{}: stages[{}].optimizer_shards ends at {} but {} trains {} elements of weights no "
         "other stage holds (re-run stagec)",
         plan::plan_file(p.plan_dir_, "plan.json"), stage.index,
         bounds.empty() ? 0 : bounds.back(), stage.backward_file, rt.sharded);
  rt.shard_bounds = bounds;
  rt.shard_lo = bounds[static_cast<size_t>(rt.replica)];
  rt.shard_hi = bounds[static_cast<size_t>(rt.replica) + 1];
}

bool Pipeline::holds_stage(int stage) const {
  const int replica = local_devices_.front() / plan_.devices;
  return runs_device(replica * plan_.devices +
                     plan_.stages.at(static_cast<size_t>(stage)).device);
}

Pipeline::ShardLayout Pipeline::shard_layout(int stage) const {
  const StageRuntime& st = first_replica_stage(stage);
  ShardLayout out;
  out.bounds = st.shard_bounds;
  for (const StageRuntime::FlatWeight& w : st.flat)
    if (st.is_sharded(w)) out.parts.push_back({w.name, w.offset, w.elements});
  return out;
}

bool Pipeline::runs_device(int device) const {
  return std::binary_search(local_devices_.begin(), local_devices_.end(), device);
}

std::unique_ptr<Pipeline> Pipeline::load(const std::string& plan_dir, const Backend& backend,
                                         int threads_per_device, std::vector<int> local_devices) {
  if (threads_per_device < 1)
    fail(ErrorKind::kUsage, "--threads-per-device must be at least 1 (got {})", threads_per_device);
  return load(plan::load_plan(plan_dir), plan_dir, backend, threads_per_device,
              std::move(local_devices));
}

std::unique_ptr<Pipeline> Pipeline::load(plan::Plan loaded, const std::string& plan_dir,
                                         const Backend& backend, int threads_per_device,
                                         std::vector<int> local_devices) {
  if (threads_per_device < 1)
    fail(ErrorKind::kUsage, "--threads-per-device must be at least 1 (got {})", threads_per_device);
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->plan_dir_ = plan_dir;
  p->backend_ = &backend;
  p->threads_per_device_ = threads_per_device;
  p->plan_ = std::move(loaded);
  const plan::Plan& plan = p->plan_;
  p->replicas_ = plan.data_parallel;
  const int devices = p->devices();  // every replica's
  if (local_devices.empty())
    for (int d = 0; d < devices; ++d) local_devices.push_back(d);
  std::sort(local_devices.begin(), local_devices.end());
  for (int d : local_devices)
    if (d < 0 || d >= devices)
      fail(ErrorKind::kUsage, "device {} is not among the plan's {} devices", d, devices);
  p->local_devices_ = std::move(local_devices);
  std::string plan_json = plan::plan_file(plan_dir, "plan.json");
  // Before anything is allocated: the backend can run here, and the plan fits the physical
  // devices its devices run on (summed where several share one).
  if (std::string why = backend.unavailable(); !why.empty())
    fail(ErrorKind::kUnsupported, "the {} backend cannot run here: {}", backend.name(), why);
  plan::check_fits(
      plan,
      [&](int device) {
        Backend::Physical d = backend.physical_device(device);
        return plan::Capacity{d.index, d.memory_bytes, d.name};
      },
      plan_json);
  if (plan.training)
    for (const plan::Stage& stage : plan.stages)
      if (stage.backward_file.empty())
        fail(ErrorKind::kPlan, "{}: stages[{}] of a training plan has no backward_file", plan_json,
             stage.index);
  for (const plan::Stage& stage : plan.stages)
    if (stage.file.empty() || stage.file_hash.empty())
      fail(ErrorKind::kPlan, "{}: stages[{}] has no stage file (a --dry-run plan cannot run)",
           plan_json, stage.index);

  p->shape_ = {plan.devices, plan.chunks, plan.microbatches, plan.training, plan.data_parallel};
  p->shape_.shared_groups = plan::shared_weight_groups(plan);
  p->shape_.placement = schedule::placement_of(plan.schedule);
  std::string schedule_path = plan::plan_file(plan_dir, "schedule.json");
  nlohmann::json body = read_json_file(schedule_path);
  p->schedule_ = with_context(plan_dir, ErrorKind::kFormat,
                              [&] { return schedule::schedule_from_json(body); });
  with_context(schedule_path, ErrorKind::kPlan,
               [&] { schedule::validate_schedule(p->schedule_, p->shape_); });
  plan::check_schedule_hash(body, plan, schedule_path);

  std::map<std::string, ModelTensor> model_inputs;
  for (int replica = 0; replica < p->replicas_; ++replica) {
    for (const plan::Stage& stage : plan.stages) {
      auto rt = std::make_shared<StageRuntime>();
      rt->stage = &stage;
      rt->replica = replica;
      // The links, graph inputs and outputs of the pipeline: every replica's are the same.
      const bool first = replica == 0;
      std::string field = fmt::format("stages[{}]", stage.index);
      // Another process's stage: only what plan.json says of it (links, graph inputs and outputs).
      if (p->runs_device(replica * plan.devices + stage.device)) load_programs(*p, *rt);
      std::set<int> producers;
      for (const plan::StageTensor& in : stage.inputs) {
        if (in.peer_stage >= 0) {
          producers.insert(in.peer_stage);
          continue;
        }
        if (!first) continue;
        ModelTensor t{in.name, plan_dtype(in, field), Shape(in.shape.begin(), in.shape.end())};
        auto [it, fresh] = model_inputs.emplace(in.name, t);
        if (!fresh && (it->second.dtype != t.dtype || it->second.shape != t.shape))
          fail(ErrorKind::kPlan, "{}: graph input '{}' has different types in two stages",
               plan_json, in.name);
      }
      rt->producers.assign(producers.begin(), producers.end());
      const auto& outs = rt->program.outputs();
      for (const plan::StageTensor& out : stage.outputs) {
        size_t index = static_cast<size_t>(
            std::find_if(outs.begin(), outs.end(),
                         [&](const ValueInfo& v) { return v.name == out.name; }) -
            outs.begin());
        const bool here = index < outs.size();
        for (int peer : out.peer_stages) {
          if (here) rt->sends[peer].push_back(index);
          if (!first) continue;
          p->links_.push_back({stage.index, peer, false});
          if (plan.training) p->links_.push_back({peer, stage.index, true});
        }
        if (out.graph_output) {
          if (here) rt->graph_outputs.push_back(index);
          if (first)
            p->outputs_.push_back(
                {out.name, plan_dtype(out, field), Shape(out.shape.begin(), out.shape.end())});
        }
      }
      p->stages_.push_back(std::move(rt));
    }
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
    if (!batch.empty()) batch[0] *= step_microbatches();
    if (t.dtype != in.dtype || (t.shape != batch && t.shape != in.shape))
      fail(ErrorKind::kShape,
           "input '{}' is {} but the plan takes {} (the batch of {} microbatches) or {} (one "
           "microbatch, given to each)",
           in.name, t.describe(), describe(in.dtype, batch), step_microbatches(),
           describe(in.dtype, in.shape));
  }
  for (const auto& [name, t] : inputs)
    if (std::none_of(inputs_.begin(), inputs_.end(),
                     [&n = name](const ModelTensor& m) { return m.name == n; }))
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
    if (!batch.empty()) batch[0] *= step_microbatches();
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

StageRuntime& Pipeline::first_replica_stage(int stage) const {
  const size_t count = plan_.stages.size();
  if (stage < 0 || stage >= static_cast<int>(count))
    fail(ErrorKind::kInternal, "stage {} is out of range (the plan has {})", stage, count);
  const size_t replica = static_cast<size_t>(local_devices_.front() / plan_.devices);
  return *stages_[replica * count + static_cast<size_t>(stage)];
}

std::vector<Pipeline::StageLoad> Pipeline::loads() const {
  std::vector<StageLoad> out;
  for (const auto& rt : stages_) {
    if (!runs_device(rt->replica * plan_.devices + rt->stage->device)) continue;
    out.push_back({rt->stage->index, rt->replica, rt->replica * plan_.devices + rt->stage->device,
                   rt->program.external_bytes(), rt->program.weight_bytes(),
                   rt->program.load_seconds()});
  }
  return out;
}

const std::map<std::string, Tensor>& Pipeline::stage_weights(int stage) const {
  sync_host();
  const StageRuntime& st = first_replica_stage(stage);
  return st.on_device ? st.host_weights : st.weights;  // the host's, also mid-run
}

bool Pipeline::trains(int stage, const std::string& weight) const {
  const StageRuntime& st = first_replica_stage(stage);
  if (!st.backward || !st.weights.count(weight)) return false;
  const std::string grad = grad::grad_name(weight);
  const auto& outputs = st.backward->outputs();
  return std::any_of(outputs.begin(), outputs.end(),
                     [&](const ValueInfo& out) { return out.name == grad; });
}

std::map<std::string, optim::OptimizerState>& Pipeline::optimizer_state(int stage) {
  sync_host();
  StageRuntime& st = first_replica_stage(stage);
  return st.on_device ? st.host_opt_state : st.opt_state;
}

const std::map<std::string, Tensor>& Pipeline::replica_weights(int replica, int stage) const {
  const size_t count = plan_.stages.size();
  if (replica < 0 || replica >= replicas_ || stage < 0 || stage >= static_cast<int>(count) ||
      !runs_device(replica * plan_.devices + plan_.stages[static_cast<size_t>(stage)].device))
    fail(ErrorKind::kInternal, "replica {}'s stage {} is not run here", replica, stage);
  sync_host();
  const StageRuntime& st =
      *stages_[static_cast<size_t>(replica) * count + static_cast<size_t>(stage)];
  return st.on_device ? st.host_weights : st.weights;
}

namespace {

/// The part [lo, hi) (elements) of a state tensor, as a tensor of its own.
Tensor part_of(const Tensor& whole, int64_t lo, int64_t hi) {
  Tensor out = Tensor::owned(DType::kFloat32, {hi - lo});
  std::memcpy(out.data, whole.data + lo * 4, static_cast<size_t>((hi - lo) * 4));
  return out;
}

}  // namespace

std::vector<std::string> Pipeline::running_statistics(int stage) const {
  std::vector<std::string> out;
  for (const Program::StateUpdate& u : first_replica_stage(stage).program.state_updates())
    out.push_back(u.weight);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::pair<int, std::vector<std::string>>> Pipeline::held_running_statistics() const {
  std::vector<std::pair<int, std::vector<std::string>>> held;
  for (const plan::Stage& stage : plan_.stages)
    if (holds_stage(stage.index))
      if (std::vector<std::string> names = running_statistics(stage.index); !names.empty())
        held.emplace_back(stage.index, std::move(names));
  return held;
}

void Pipeline::share_running_statistics() {
  if (replicas_ < 2) return;
  const auto shared = held_running_statistics();
  if (shared.empty()) return;
  sync_host();
  for (const auto& [index, names] : shared) {
    const StageRuntime& first = first_replica_stage(index);
    for (const auto& rt : stages_) {
      if (rt->stage->index != index || rt.get() == &first || rt->weights.empty()) continue;
      for (const std::string& name : names) {
        const Tensor& from = first.weights.at(name);
        Tensor& to = rt->weights.at(name);
        if (to.bytes() != from.bytes())
          fail(ErrorKind::kInternal, "stage {}: running statistic '{}' has {} bytes in replica {} "
               "and {} in the first", index, name, to.bytes(), rt->replica, from.bytes());
        if (to.bytes() > 0) std::memcpy(to.data, from.data, static_cast<size_t>(to.bytes()));
      }
    }
  }
}

void Pipeline::copy_first_replica() {
  sync_host();
  for (size_t k = 0; k < plan_.stages.size(); ++k) {
    StageRuntime& first = first_replica_stage(static_cast<int>(k));
    if (first.weights.empty()) continue;  // another process's
    // The first replica's state is the stage's whole state here (as loaded); with ZeRO-1 each
    // replica, the first last, keeps its shard of it.
    const std::map<std::string, optim::OptimizerState> whole = first.opt_state;
    std::vector<StageRuntime*> replicas;
    for (const auto& rt : stages_)
      if (rt->stage->index == static_cast<int>(k) && rt.get() != &first && !rt->weights.empty())
        replicas.push_back(rt.get());
    for (StageRuntime* rt : replicas)
      for (auto& [name, w] : rt->weights) {
        const Tensor& from = first.weights.at(name);
        if (w.bytes() > 0) std::memcpy(w.data, from.data, static_cast<size_t>(w.bytes()));
      }
    replicas.push_back(&first);
    for (StageRuntime* rt : replicas) {
      rt->opt_state.clear();
      for (const auto& [name, state] : whole) {
        const StageRuntime::FlatWeight* part = rt->flat_weight(name);
        if (part == nullptr || !rt->is_sharded(*part)) {
          for (const auto& [key, t] : state.tensors) rt->opt_state[name].tensors[key] = clone(t);
          continue;
        }
        auto [lo, hi] = rt->own_part(*part);
        if (lo == hi) continue;
        for (const auto& [key, t] : state.tensors) {
          if (t.numel() != part->elements)
            fail(ErrorKind::kInternal, "stage {}: state '{}' of '{}' has {} elements, not {}", k,
                 key, name, t.numel(), part->elements);
          rt->opt_state[name].tensors[key] = part_of(t, lo, hi);
        }
      }
    }
  }
}

std::map<std::string, optim::OptimizerState> Pipeline::whole_optimizer_state(int stage) const {
  sync_host();
  const StageRuntime& first = first_replica_stage(stage);
  auto state_of = [](const StageRuntime& st) -> const std::map<std::string, optim::OptimizerState>& {
    return st.on_device ? st.host_opt_state : st.opt_state;
  };
  if (first.shard_bounds.empty()) return state_of(first);
  // ZeRO-1: every replica's shard, put together (the shared weights' state whole, from the
  // first replica: every replica keeps the same).
  std::map<std::string, optim::OptimizerState> whole;
  for (const auto& [name, state] : state_of(first)) {
    const StageRuntime::FlatWeight* part = first.flat_weight(name);
    if (part == nullptr || !first.is_sharded(*part)) whole[name] = state;
  }
  for (int r = 0; r < replicas_; ++r) {
    const size_t at = static_cast<size_t>(r) * plan_.stages.size() + static_cast<size_t>(stage);
    const StageRuntime& rt = *stages_.at(at);
    if (rt.weights.empty())
      fail(ErrorKind::kUnsupported,
           "stage {}: its optimizer state is sharded over {} replicas and replica {}'s shard is "
           "in another process",
           stage, replicas_, r);
    for (const auto& [name, state] : state_of(rt)) {
      const StageRuntime::FlatWeight* part = rt.flat_weight(name);
      if (part == nullptr || !rt.is_sharded(*part)) continue;
      auto [lo, hi] = rt.own_part(*part);
      const Tensor& weight = (rt.on_device ? rt.host_weights : rt.weights).at(name);
      for (const auto& [key, t] : state.tensors) {
        Tensor& target = whole[name].tensors[key];
        if (target.dtype == DType::kUndefined) target = Tensor::owned(DType::kFloat32, weight.shape);
        if (t.numel() != hi - lo)
          fail(ErrorKind::kInternal, "stage {} replica {}: state '{}' of '{}' has {} elements, not {}",
               stage, r, key, name, t.numel(), hi - lo);
        std::memcpy(target.data + lo * 4, t.data, static_cast<size_t>((hi - lo) * 4));
      }
    }
  }
  return whole;
}

const std::map<std::string, optim::OptimizerState>& Pipeline::optimizer_state(int stage) const {
  return const_cast<Pipeline*>(this)->optimizer_state(stage);
}

}  // namespace stagecraft::rt
