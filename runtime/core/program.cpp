#include "runtime/core/program.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>

#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/format/grad_reads.h"
#include "runtime/format/lifetimes.h"

namespace stagecraft::rt {

namespace {

// splitmix64's finaliser: a bijection of 64-bit keys whose outputs look independent.
uint64_t mix_key(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a of a node's name: what its random draws depend on besides the step and microbatch.
uint64_t name_hash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// A BatchNormalization in training mode as model.eval() runs it (TrainingRun::eval_mode): a copy
// with training_mode 0, so its kernel normalises with the running statistics, inputs 3 and 4.
// Null for any other node.
std::shared_ptr<const onnx::NodeProto> eval_mode_node(const onnx::NodeProto& node,
                                                      const Attrs& attrs) {
  if (node.op_type() != "BatchNormalization" || !node.domain().empty() ||
      attrs.i("training_mode", 0) == 0)
    return nullptr;
  auto copy = std::make_shared<onnx::NodeProto>(node);
  for (onnx::AttributeProto& attribute : *copy->mutable_attribute())
    if (attribute.name() == "training_mode") attribute.set_i(0);
  return copy;
}

// Eval mode (model.eval(), TrainingRun::eval_mode) of a node's kernel arguments, `step` being a
// Program step (a template: the type is Program's own): a Dropout without its training_mode
// input is the identity, on every backend, whatever the file's training_mode says; a
// BatchNormalization in training mode runs as inference (its running statistics normalise) and
// writes no statistics. Returns the attributes the kernel reads.
template <class Step>
const Attrs& eval_mode_args(const Step& step, std::vector<const Tensor*>& in,
                            std::vector<Tensor*>& out) {
  if (step.op_type == "Dropout" && in.size() > 2) in[2] = nullptr;
  if (step.eval_node == nullptr) return step.attrs;
  std::fill(out.begin() + 1, out.end(), nullptr);
  return step.eval_attrs;
}

// Before opset 14 a BatchNormalization in training mode is one with outputs beyond Y (running
// mean and var, saved mean and inverse std) and no training_mode attribute, as stagec writes a
// model of those opsets (compiler/ir/onnx_bridge.cpp): read as the opset 14 form the kernels
// run, training_mode=1 and no saved statistics (refused where a node reads them).
void read_old_training_batch_norms(onnx::ModelProto& model) {
  int64_t opset = 0;
  for (const auto& imp : model.opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx") opset = imp.version();
  if (opset == 0 || opset >= 14) return;
  for (onnx::NodeProto& node : *model.mutable_graph()->mutable_node()) {
    if (node.op_type() != "BatchNormalization" || !node.domain().empty()) continue;
    bool training = false;
    for (int k = 1; k < node.output_size(); ++k) training |= !node.output(k).empty();
    const bool has_mode = std::any_of(node.attribute().begin(), node.attribute().end(),
                                      [](const auto& a) { return a.name() == "training_mode"; });
    if (!training || has_mode) continue;
    for (int k = 3; k < node.output_size(); ++k) {
      const std::string& saved = node.output(k);
      if (saved.empty()) continue;
      for (const onnx::NodeProto& reader : model.graph().node())
        if (std::find(reader.input().begin(), reader.input().end(), saved) != reader.input().end())
          fail(ErrorKind::kModel,
               "node '{}' reads '{}', the saved statistics of BatchNormalization '{}' (opset {}), "
               "which stagecraft does not compute",
               reader.name(), saved, node.name(), opset);
    }
    while (node.output_size() > 3) node.mutable_output()->RemoveLast();
    auto* mode = node.add_attribute();
    mode->set_name("training_mode");
    mode->set_type(onnx::AttributeProto::INT);
    mode->set_i(1);
  }
}

// The state updates (Program::StateUpdate) of `node`, as (output slot, weight slot): a
// BatchNormalization in training mode writes outputs 1 and 2 into inputs 3 and 4 where those
// are weights. `info(slot)` gives a slot's type, `is_weight(slot)` whether it is a weight.
template <class Info, class IsWeight>
std::vector<std::pair<int, int>> state_updates_of(const onnx::NodeProto& node, const Attrs& attrs,
                                                  const std::vector<int>& inputs,
                                                  const std::vector<int>& outputs, Info info,
                                                  IsWeight is_weight) {
  std::vector<std::pair<int, int>> updates;
  if (node.op_type() != "BatchNormalization" || !node.domain().empty() ||
      attrs.i("training_mode", 0) == 0)
    return updates;
  for (size_t k = 1; k <= 2; ++k) {
    const int from = k < outputs.size() ? outputs[k] : -1;
    const int to = k + 2 < inputs.size() ? inputs[k + 2] : -1;
    if (from < 0 || to < 0 || !is_weight(to)) continue;
    const ValueInfo &stat = *info(from), &weight = *info(to);
    if (stat.dtype != weight.dtype || stat.shape != weight.shape)
      fail(ErrorKind::kShape, "running statistic '{}' is {}{} but weight '{}' is {}{}", stat.name,
           dtype_name(stat.dtype), shape_string(stat.shape), weight.name, dtype_name(weight.dtype),
           shape_string(weight.shape));
    updates.emplace_back(from, to);
  }
  return updates;
}

// The static type of a value from a ValueInfoProto; every dim must be a known number.
ValueInfo static_info(const onnx::ValueInfoProto& proto) {
  ValueInfo info;
  info.name = proto.name();
  if (!proto.type().has_tensor_type())
    fail(ErrorKind::kUnsupported,
         "tensor '{}' is not a plain tensor (sequences and maps are not supported)", proto.name());
  const auto& tt = proto.type().tensor_type();
  auto dtype = dtype_from_onnx(tt.elem_type());
  if (!dtype || dtype_size(*dtype) <= 0)
    fail(ErrorKind::kUnsupported,
         "tensor '{}' has element type {}, which the runtime does not handle", proto.name(),
         tt.elem_type());
  info.dtype = *dtype;
  if (!tt.has_shape()) fail(ErrorKind::kShape, "tensor '{}' has no static shape", proto.name());
  for (const auto& dim : tt.shape().dim()) {
    if (!dim.has_dim_value() || dim.dim_value() < 0)
      fail(ErrorKind::kShape, "tensor '{}' has no static shape (dim '{}')", proto.name(),
           dim.has_dim_param() ? dim.dim_param() : std::string("?"));
    info.shape.push_back(dim.dim_value());
  }
  return info;
}

/// Cast's attributes for the 16-bit fallback: "to" float32, bfloat16 or float16.
const Attrs& cast_attrs(DType to) {
  auto node = [](int64_t onnx_type) {
    onnx::NodeProto n;
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name("to");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(onnx_type);
    return n;
  };
  static const onnx::NodeProto to_float = node(onnx::TensorProto::FLOAT),
                               to_bf16 = node(onnx::TensorProto::BFLOAT16),
                               to_fp16 = node(onnx::TensorProto::FLOAT16);
  static const Attrs float_attrs(to_float), bf16_attrs(to_bf16), fp16_attrs(to_fp16);
  if (to == DType::kFloat16) return fp16_attrs;
  return to == DType::kFloat32 ? float_attrs : bf16_attrs;
}

/// `from` cast into `to` (allocated) by the backend's Cast kernel `cast`.
void cast_into(KernelFn cast, const KernelArgs& node, const Tensor& from, Tensor& to) {
  const Tensor* in[] = {&from};
  Tensor* out[] = {&to};
  cast(KernelArgs{node.name, "Cast", cast_attrs(to.dtype), in, out, node.device, 0});
}

}  // namespace

// kernel.h. The copies are the device's own tensors for the node's duration, not arena bytes:
// kernel workspace, as a library's scratch is. On CUDA new_tensor draws from the device's
// stream-ordered pool (cudaMallocAsync), which after the first step hands back the same blocks
// without a driver allocation, so a step allocates nothing from the driver.
void run_widened(KernelFn kernel, KernelFn cast, bool zero_outputs, const KernelArgs& args) {
  std::vector<Tensor> wide_in(args.in.size()), wide_out(args.out.size());
  std::vector<const Tensor*> in(args.in.begin(), args.in.end());
  std::vector<Tensor*> out(args.out.begin(), args.out.end());
  for (size_t k = 0; k < in.size(); ++k) {
    if (!in[k] || !is_16bit_float(in[k]->dtype)) continue;
    if (in[k]->is_bare()) {
      // A bare operand (read for its shape only: Program::inputs_read) stays bare.
      wide_in[k] = Tensor::bare(DType::kFloat32, in[k]->shape);
      in[k] = &wide_in[k];
      continue;
    }
    wide_in[k] = args.device.new_tensor(DType::kFloat32, in[k]->shape, false);
    cast_into(cast, args, *in[k], wide_in[k]);
    in[k] = &wide_in[k];
  }
  for (size_t k = 0; k < out.size(); ++k) {
    if (!out[k] || !is_16bit_float(out[k]->dtype))
      continue;
    wide_out[k] = args.device.new_tensor(DType::kFloat32, out[k]->shape, zero_outputs);
    out[k] = &wide_out[k];
  }
  kernel(KernelArgs{args.name, args.op_type, args.attrs, in, out, args.device, args.random_key});
  for (size_t k = 0; k < out.size(); ++k)
    if (wide_out[k].dtype != DType::kUndefined) cast_into(cast, args, wide_out[k], *args.out[k]);
}

namespace {

// Runs one node's kernel (between casts for the 16-bit fallback) inside a range named `name`
// (NVTX on CUDA, so a profiler maps the kernels to the node), timed for the per-node profile
// when the hook asks (NodeHook::timed).
void run_node(KernelFn kernel, KernelFn cast, bool zero_outputs, const KernelArgs& args,
              const char* name, const NodeHook* hook) {
  auto body = [&] {
    if (cast)
      run_widened(kernel, cast, zero_outputs, args);
    else
      kernel(args);
  };
  args.device.range_push(name);
  if (hook && hook->timed) {
    DeviceContext& device = args.device;
    device.notes.clear();
    device.collect_notes = true;
    double ms = 0;
    try {
      ms = device.time_ms(body);
    } catch (...) {
      device.collect_notes = false;
      throw;
    }
    device.collect_notes = false;
    hook->timed(args.name, args.op_type, ms, node_work(args.op_type, args.attrs, args.in, args.out),
                device.notes);
  } else {
    body();
  }
  args.device.range_pop();
}

}  // namespace

Program Program::load_file(const std::string& path, const Backend& backend,
                           const std::optional<RecordedArena>& arena,
                           const ExternalWeights* external) {
  const auto start = std::chrono::steady_clock::now();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "{}: cannot open", path);
  onnx::ModelProto model;
  if (!model.ParseFromIstream(&in))
    fail(ErrorKind::kFormat, "{}: not an ONNX model (protobuf parse failed)", path);
  Program p = from_model(model, backend, path, arena, external);
  p.load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

Program Program::from_model(const onnx::ModelProto& model_in, const Backend& backend,
                            const std::string& source, const std::optional<RecordedArena>& arena,
                            const ExternalWeights* external) {
  return with_context(source, ErrorKind::kInternal, [&] {
    Program p;
    p.source_ = source;
    p.model_ = std::make_shared<onnx::ModelProto>(model_in);
    read_old_training_batch_norms(*p.model_);
    const onnx::GraphProto& graph = p.model_->graph();
    std::map<std::string, int, std::less<>> slot_of;
    auto add_slot = [&](Slot slot) {
      if (slot_of.count(slot.info.name))
        fail(ErrorKind::kModel, "tensor '{}' is defined twice", slot.info.name);
      slot_of[slot.info.name] = static_cast<int>(p.slots_.size());
      p.slots_.push_back(std::move(slot));
      return static_cast<int>(p.slots_.size()) - 1;
    };

    // Weights first (old models also list them among the inputs; those are not inputs).
    ExternalWeightReader reader(external, source);
    for (const onnx::TensorProto& init : graph.initializer()) {
      Slot slot;
      slot.kind = Slot::kWeight;
      slot.weight = init.data_location() == onnx::TensorProto::EXTERNAL
                        ? reader.read(init)
                        : tensor_from_proto(init, fmt::format("initializer '{}'", init.name()));
      slot.info = {init.name(), slot.weight.dtype, slot.weight.shape};
      p.weight_bytes_ += slot.weight.bytes();
      add_slot(std::move(slot));
    }
    reader.finish();
    p.external_bytes_ = reader.bytes_read();
    for (const onnx::ValueInfoProto& input : graph.input()) {
      if (slot_of.count(input.name())) continue;
      Slot slot;
      slot.kind = Slot::kInput;
      slot.info = static_info(input);
      p.inputs_.push_back(slot.info);
      p.input_slots_.push_back(add_slot(std::move(slot)));
    }
    std::map<std::string, ValueInfo, std::less<>> declared;
    for (const auto& vi : graph.value_info()) declared[vi.name()] = static_info(vi);
    for (const auto& vi : graph.output()) declared[vi.name()] = static_info(vi);

    for (int n = 0; n < graph.node_size(); ++n) {
      const onnx::NodeProto& node = graph.node(n);
      std::string node_name =
          node.name().empty() ? fmt::format("#{} ({})", n, node.op_type()) : node.name();
      with_context(fmt::format("node '{}'", node_name), ErrorKind::kInternal, [&] {
        if (!node.domain().empty() && node.domain() != "ai.onnx" &&
            node.domain() != grad::kGradDomain)
          fail(ErrorKind::kUnsupported, "op '{}' of domain '{}' has no {} kernel", node.op_type(),
               node.domain(), backend.name());
        Step step;
        step.name = node_name;
        step.op_type = node.op_type();
        step.attrs = Attrs(node);
        step.weight_gradients = step.attrs.i(grad::kWeightGradAttr, 0) != 0;
        step.name_hash = name_hash(step.name);
        std::vector<DType> in_types, out_types;
        for (const std::string& name : node.input()) {
          if (name.empty()) {
            step.inputs.push_back(-1);
            in_types.push_back(DType::kUndefined);
            continue;
          }
          auto it = slot_of.find(name);
          if (it == slot_of.end())
            fail(ErrorKind::kModel, "input '{}' is not defined before it is used", name);
          step.inputs.push_back(it->second);
          in_types.push_back(p.slots_[it->second].info.dtype);
        }
        for (const std::string& name : node.output()) {
          if (name.empty()) {
            step.outputs.push_back(-1);
            out_types.push_back(DType::kUndefined);
            continue;
          }
          auto it = declared.find(name);
          if (it == declared.end())
            fail(ErrorKind::kShape, "output '{}' has no recorded type and static shape", name);
          Slot slot;
          slot.info = it->second;
          bool is_output = false;
          for (const auto& out : graph.output()) is_output |= out.name() == name;
          slot.kind = is_output ? Slot::kOutput : Slot::kIntermediate;
          int index = add_slot(std::move(slot));
          step.outputs.push_back(index);
          out_types.push_back(p.slots_[index].info.dtype);
        }
        std::string why = backend.check(OpSignature{step.op_type, in_types, out_types, step.attrs});
        if (!why.empty()) fail(ErrorKind::kUnsupported, "{}", why);
        if (backend.runs_widened(OpSignature{step.op_type, in_types, out_types, step.attrs}))
          step.cast = backend.kernel("Cast");
        const KernelEntry& entry = backend.entry(step.op_type);
        step.kernel = entry.run;
        step.state_updates = state_updates_of(
            node, step.attrs, step.inputs, step.outputs, [&](int s) { return &p.slots_[s].info; },
            [&](int s) { return p.slots_[s].kind == Slot::kWeight; });
        step.zero_outputs = node.domain() == grad::kGradDomain && !entry.writes_every_output;
        step.eval_node = eval_mode_node(node, step.attrs);
        if (step.eval_node) step.eval_attrs = Attrs(*step.eval_node);
        p.nodes_.push_back(std::move(step));
      });
    }
    for (const auto& out : graph.output()) {
      auto it = slot_of.find(out.name());
      if (it == slot_of.end())
        fail(ErrorKind::kModel, "graph output '{}' is produced by no node", out.name());
      p.output_slots_.push_back(it->second);
      p.outputs_.push_back(p.slots_[it->second].info);
    }
    p.place_intermediates(arena);
    return p;
  });
}

// The arena: every intermediate alive from its node to its last reader (lifetimes.h), placed by
// the compiler's recorded plan or planned here; views share their sources' bytes.
void Program::place_intermediates(const std::optional<RecordedArena>& arena) {
  graph_.values = static_cast<int>(slots_.size());
  for (const Step& step : nodes_)
    graph_.nodes.push_back({step.op_type, step.inputs, step.outputs, step.weight_gradients});
  std::vector<int64_t> bytes;
  std::vector<bool> is_output;
  for (const Slot& slot : slots_) {
    bytes.push_back(slot.info.numel_bytes());
    is_output.push_back(slot.kind != Slot::kIntermediate);
  }
  const plan::Intermediates intermediates =
      plan::intermediate_lifetimes(graph_, bytes, is_output);
  const std::vector<plan::Lifetime>& lifetimes = intermediates.lifetimes;
  for (size_t t = 0; t < intermediates.values.size(); ++t) {
    slots_[intermediates.values[t]].memory_index = static_cast<int>(t);
    if (const int root = intermediates.alias[t]; root >= 0)
      slots_[intermediates.values[t]].alias = intermediates.values[root];
  }
  for (size_t n = 0; n < nodes_.size(); ++n)
    if (size_t source = 0; plan::is_view_node(graph_.nodes[n], &source))
      nodes_[n].view_source = nodes_[n].inputs[source];
  if (!arena) {
    memory_ = plan::plan_memory(lifetimes);
  } else {
    // The compiler's plan: every intermediate placed, with the size the file gives it.
    std::map<std::string, const plan::ArenaTensor*, std::less<>> placed;
    for (const plan::ArenaTensor& t : arena->stage->arena) placed[t.name] = &t;
    if (placed.size() != lifetimes.size())
      fail(ErrorKind::kPlan, "{} places {} tensors but the stage file has {} intermediates",
           arena->field, placed.size(), lifetimes.size());
    memory_.arena_bytes = arena->stage->arena_bytes;
    for (size_t t = 0; t < lifetimes.size(); ++t) {
      const std::string& name = slots_[intermediates.values[t]].info.name;
      auto it = placed.find(name);
      if (it == placed.end())
        fail(ErrorKind::kPlan, "{} has no place for intermediate '{}'", arena->field, name);
      if (it->second->bytes != lifetimes[t].bytes)
        fail(ErrorKind::kPlan, "{} gives '{}' {} bytes; the stage file's tensor has {}",
             arena->field, name, it->second->bytes, lifetimes[t].bytes);
      memory_.offsets.push_back(it->second->offset);
    }
  }
  plan::check_memory_plan(lifetimes, memory_, arena ? arena->field : source_);
}

int64_t Program::output_bytes() const {
  int64_t total = 0;
  for (const ValueInfo& out : outputs_) total += shape_numel(out.shape) * dtype_size(out.dtype);
  return total;
}

uint64_t Program::random_key(int64_t step, int64_t microbatch) {
  // Never 0 (which means "no training step"): step counts from 1.
  return mix_key(mix_key(static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(microbatch)) | 1u;
}

std::vector<Program::StateUpdate> Program::state_updates() const {
  std::vector<StateUpdate> out;
  for (const Step& step : nodes_)
    for (const auto& [from, to] : step.state_updates)
      out.push_back({step.name, slots_[from].info.name, slots_[to].info.name});
  return out;
}

std::vector<std::string> Program::widened_ops() const {
  std::vector<std::string> out;
  for (const Step& step : nodes_) {
    if (step.cast == nullptr) continue;
    auto types = [&](const std::vector<int>& slots) {
      std::string list;
      for (int s : slots)
        list += std::string(list.empty() ? "" : ", ") +
                (s < 0 ? "-" : std::string(dtype_name(slots_[static_cast<size_t>(s)].info.dtype)));
      return list;
    };
    out.push_back(step.op_type + "(" + types(step.inputs) + " -> " + types(step.outputs) + ")");
  }
  return out;
}

std::vector<std::string> Program::weight_casts() const {
  std::vector<bool> updated(slots_.size(), false);
  for (const Step& step : nodes_)
    for (const auto& [from, to] : step.state_updates) updated[static_cast<size_t>(to)] = true;
  std::vector<std::string> out;
  for (const Step& step : nodes_) {
    if (step.op_type != "Cast" || step.inputs.size() != 1 || step.outputs.size() != 1) continue;
    const int in = step.inputs[0];
    if (in < 0 || slots_[static_cast<size_t>(in)].kind != Slot::kWeight ||
        updated[static_cast<size_t>(in)])
      continue;
    out.push_back(slots_[static_cast<size_t>(step.outputs[0])].info.name);
  }
  return out;
}

std::vector<Tensor> Program::run(DeviceContext& device, std::span<const Tensor> inputs,
                                 std::byte* arena, const NodeHook* hook,
                                 const TrainingRun& run) const {
  return execute(device, inputs, arena, nullptr, hook, nullptr, run);
}

std::vector<Tensor> Program::run_keeping(DeviceContext& device, std::span<const Tensor> inputs,
                                         std::map<std::string, Tensor>& kept,
                                         const std::set<std::string>& keep, std::byte* arena,
                                         const NodeHook* hook, const TrainingRun& run) const {
  return execute(device, inputs, arena, &kept, hook, nullptr, run, &keep);
}

std::vector<bool> Program::inputs_read() const {
  std::vector<bool> read_slot(slots_.size(), false);
  for (const Step& step : nodes_) {
    // A gradient node of our domain reads its forward operands as the contract's table says;
    // every other node reads all its inputs.
    const int64_t forward_inputs = step.attrs.i(grad::kForwardInputsAttr, -1);
    const bool gradient = step.op_type.ends_with(grad::kGradSuffix) && forward_inputs >= 0;
    const std::string_view forward =
        std::string_view(step.op_type).substr(0, step.op_type.size() - grad::kGradSuffix.size());
    const auto n = static_cast<size_t>(gradient ? forward_inputs : int64_t{0});
    const size_t operands = gradient ? n + (step.inputs.size() - n) / 2 : 0;
    for (size_t p = 0; p < step.inputs.size(); ++p) {
      const int s = step.inputs[p];
      if (s < 0) continue;
      if (!gradient || p >= operands || grad::reads_bytes(forward, n, p)) read_slot[s] = true;
    }
  }
  // A program output that is one of its inputs passes its bytes on.
  for (int s : output_slots_) read_slot[s] = true;
  std::vector<bool> out;
  for (int s : input_slots_) out.push_back(read_slot[s]);
  return out;
}

std::map<std::string, Tensor> Program::weights() const {
  std::map<std::string, Tensor> out;
  for (const Slot& slot : slots_)
    if (slot.kind == Slot::kWeight) out[slot.info.name] = slot.weight;
  return out;
}

void Program::rebind_weights(const std::map<std::string, Tensor>& weights) {
  for (Slot& slot : slots_) {
    if (slot.kind != Slot::kWeight) continue;
    auto it = weights.find(slot.info.name);
    if (it == weights.end())
      fail(ErrorKind::kInternal, "{}: rebinding weights: '{}' is missing", source_, slot.info.name);
    if (it->second.dtype != slot.weight.dtype || it->second.shape != slot.weight.shape)
      fail(ErrorKind::kInternal, "{}: rebinding weight '{}' ({}) to {}", source_, slot.info.name,
           slot.weight.describe(), it->second.describe());
    slot.weight = it->second;
  }
}

std::vector<Tensor> Program::run_subset(DeviceContext& device, std::span<const Tensor> inputs,
                                        std::map<std::string, Tensor>& kept,
                                        const std::vector<bool>& mask, std::byte* arena,
                                        const NodeHook* hook) const {
  return execute(device, inputs, arena, &kept, hook, &mask);
}

std::vector<bool> Program::weight_gradient_nodes() const {
  return plan::weight_gradient_nodes(graph_);
}

// A view the run hands on whose chain of sources starts at an intermediate of this run: that
// intermediate gets bytes of its own rather than arena bytes, and the view shares them (its
// storage keeps them alive) rather than copying them (the head of a MatMul kept for its weight
// gradient, after a Reshape). The same bytes are held either way.
Program::ViewSharing Program::view_sharing(const std::vector<bool>* mask,
                                           const std::function<bool(size_t)>& handed_on) const {
  std::vector<int> producer(slots_.size(), -1);
  for (size_t n = 0; n < nodes_.size(); ++n)
    for (int s : nodes_[n].outputs)
      if (s >= 0) producer[s] = static_cast<int>(n);
  const auto runs = [&](int n) { return n >= 0 && (!mask || (*mask)[n]); };
  ViewSharing out{std::vector<char>(slots_.size(), 0), std::vector<char>(slots_.size(), 0)};
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Step& step = nodes_[n];
    const int s = step.outputs.empty() ? -1 : step.outputs[0];
    if (s < 0 || slots_[s].alias < 0 || !runs(static_cast<int>(n)) || !handed_on(s)) continue;
    int root = step.view_source;
    // Up through the views placed on their sources' bytes (not handed on, or sharing too).
    while (root >= 0 && slots_[root].alias >= 0 && (!handed_on(root) || out.shares[root]) &&
           runs(producer[root]))
      root = nodes_[producer[root]].view_source;
    if (root < 0 || slots_[root].kind != Slot::kIntermediate || !runs(producer[root])) continue;
    out.own_bytes[root] = 1;
    out.shares[s] = 1;
  }
  return out;
}

std::vector<Tensor> Program::execute(DeviceContext& device, std::span<const Tensor> inputs,
                                     std::byte* arena, std::map<std::string, Tensor>* kept,
                                     const NodeHook* hook, const std::vector<bool>* mask,
                                     const TrainingRun& run,
                                     const std::set<std::string>* keep) const {
  if (inputs.size() != input_slots_.size())
    fail(ErrorKind::kInternal, "{}: {} inputs given, the program takes {}", source_, inputs.size(),
         input_slots_.size());
  if (keep && !arena && arena_bytes() > 0)
    fail(ErrorKind::kInternal, "{}: a run keeping some values needs the arena for the others",
         source_);
  std::vector<Tensor> values(slots_.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ValueInfo& info = inputs_[k];
    if (inputs[k].dtype != info.dtype || inputs[k].shape != info.shape)
      fail(ErrorKind::kShape, "{}: input '{}' is {} but the program takes {}{}", source_, info.name,
           inputs[k].describe(), dtype_name(info.dtype), shape_string(info.shape));
    values[input_slots_[k]] = inputs[k];
  }
  // A part of the program (mask): the intermediates that nodes outside it read cross to the
  // other part, so they get their own bytes and are kept; the rest live in the arena.
  std::vector<bool> crossing, mine;
  if (mask) {
    crossing = plan::crossing_values(graph_, *mask);
    mine.assign(slots_.size(), false);
    for (size_t n = 0; n < nodes_.size(); ++n)
      if ((*mask)[n])
        for (int s : nodes_[n].outputs)
          if (s >= 0) mine[s] = true;
  }
  // Whether the run hands value `s` on (a part's crossing value, a whole run's kept value).
  auto handed_on = [&](size_t s) {
    return mask ? static_cast<bool>(crossing[s])
                : kept != nullptr && (!keep || keep->count(slots_[s].info.name) > 0);
  };
  const ViewSharing sharing = view_sharing(mask, handed_on);
  for (size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.kind == Slot::kWeight) {
      values[s] = slot.weight;
    } else if (slot.kind == Slot::kIntermediate) {
      // Kernels write their outputs (gradient kernels that need zeros get them below).
      if (sharing.shares[s]) continue;  // its source's bytes, below
      values[s] = handed_on(s) || sharing.own_bytes[s]
                      ? device.new_tensor(slot.info.dtype, slot.info.shape, false)
                      : Tensor::view(slot.info.dtype, slot.info.shape,
                                     arena + memory_.offsets[slot.memory_index]);
    } else if (slot.kind == Slot::kOutput && (!mask || mine[s])) {
      values[s] = device.new_tensor(slot.info.dtype, slot.info.shape, false);
    }
  }
  if (mask) {
    // Values of the nodes left out come from the earlier part.
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if ((*mask)[n]) continue;
      for (int s : nodes_[n].outputs) {
        if (s < 0) continue;
        auto it = kept->find(slots_[s].info.name);
        values[s] = it == kept->end() ? Tensor{} : it->second;
      }
    }
  }
  // A view's output shares its source's bytes (lifetimes.h) where the run places it in the
  // arena and runs its node, or when kept its source's own bytes (view_sharing); anywhere else
  // (kept, or a part's value from the other part) it gets bytes of its own and its node copies.
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Step& step = nodes_[n];
    const int s = step.outputs.empty() ? -1 : step.outputs[0];
    if (s < 0 || slots_[s].alias < 0 || (mask && !(*mask)[n])) continue;
    const ValueInfo& info = slots_[s].info;
    if (handed_on(static_cast<size_t>(s)) && !sharing.shares[s]) continue;
    const Tensor& source = values[step.view_source];
    values[s] = source.data != nullptr ? Tensor{info.dtype, info.shape, source.data, source.storage, {}}
                                       : device.new_tensor(info.dtype, info.shape, false);
  }
  std::vector<const Tensor*> in_ptrs;
  std::vector<Tensor*> out_ptrs;
  // State updates (TrainingRun::update_state): each new value copied aside right after its node
  // (an arena value may be overwritten later), into its weight after the last node (every node
  // of this run reads the weight as it was when the run began, as ONNX's semantics say).
  std::vector<std::pair<Tensor, int>> new_state;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Step& step = nodes_[n];
    if (mask && !(*mask)[n]) continue;
    // A view sharing its source's bytes: nothing to copy.
    const bool shared = step.view_source >= 0 && !step.outputs.empty() && step.outputs[0] >= 0 &&
                        values[step.outputs[0]].data != nullptr &&
                        values[step.outputs[0]].data == values[step.view_source].data;
    if (shared) {
      if (hook && hook->before) hook->before(step.name, step.op_type);
      continue;
    }
    in_ptrs.clear();
    out_ptrs.clear();
    for (int s : step.inputs) in_ptrs.push_back(s < 0 ? nullptr : &values[s]);
    // An omitted optional output gets a scratch tensor-less null; kernels skip null outputs.
    for (int s : step.outputs) out_ptrs.push_back(s < 0 ? nullptr : &values[s]);
    const Attrs& attrs = run.eval_mode ? eval_mode_args(step, in_ptrs, out_ptrs) : step.attrs;
    if (step.zero_outputs)
      for (Tensor* t : out_ptrs)
        if (t) device.fill_zero(*t);
    try {
      if (hook && hook->before) hook->before(step.name, step.op_type);
      KernelArgs args{step.name,
                      step.op_type,
                      attrs,
                      in_ptrs,
                      out_ptrs,
                      device,
                      mix_key(run.random_key ^ step.name_hash)};
      run_node(step.kernel, step.cast, step.zero_outputs, args, step.name.c_str(), hook);
      if (hook && hook->output_ready)
        for (int out_slot : step.outputs)
          if (out_slot >= 0 && slots_[out_slot].kind == Slot::kOutput)
            for (size_t k = 0; k < output_slots_.size(); ++k)
              if (output_slots_[k] == out_slot) hook->output_ready(k, values[out_slot]);
      if (run.update_state)
        for (const auto& [from, to] : step.state_updates)
          new_state.emplace_back(clone_on(device, values[from]), to);
    } catch (Error& e) {
      e.in(fmt::format("node '{}' ({})", step.name, step.op_type)).in(source_);
      throw;
    } catch (const std::exception& e) {
      throw error_from(e, ErrorKind::kInternal)
          .in(fmt::format("node '{}' ({})", step.name, step.op_type))
          .in(source_);
    }
  }
  for (auto& [value, to] : new_state) device.copy(value, values[to]);
  if (mask) {
    // Keep what the other part reads and this part made.
    for (size_t n = 0; n < nodes_.size(); ++n)
      if ((*mask)[n])
        for (int s : nodes_[n].outputs)
          if (s >= 0 && crossing[s]) (*kept)[slots_[s].info.name] = values[s];
  } else if (kept) {
    for (size_t s = 0; s < slots_.size(); ++s)
      if (values[s].dtype != DType::kUndefined && handed_on(s))
        (*kept)[slots_[s].info.name] = values[s];
  }
  std::vector<Tensor> outputs;
  outputs.reserve(output_slots_.size());
  for (int s : output_slots_) {
    const Slot& slot = slots_[s];
    outputs.push_back(slot.kind == Slot::kOutput || values[s].dtype == DType::kUndefined
                          ? values[s]
                          : clone_on(device, values[s]));
  }
  return outputs;
}

std::vector<Tensor> run_from_host(const Program& program, DeviceContext& device,
                                  std::span<const Tensor> inputs, std::byte* arena) {
  if (device.host_visible()) return program.run(device, inputs, arena);
  Program on_device = program;
  std::map<std::string, Tensor> weights;
  for (const auto& [name, w] : program.weights()) weights[name] = to_device(device, w);
  on_device.rebind_weights(weights);
  std::vector<Tensor> in;
  // A bare input (no bytes: Program::inputs_read) stays bare.
  for (const Tensor& t : inputs)
    in.push_back(t.is_bare() ? t : to_device(device, t));
  std::vector<Tensor> out = on_device.run(device, in, arena);
  for (Tensor& t : out) t = to_host(device, t);
  return out;
}

}  // namespace stagecraft::rt
