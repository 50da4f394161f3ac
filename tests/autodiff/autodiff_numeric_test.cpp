// Autodiff (passes/autodiff.cpp): gradients of backward programs against central differences of
// the forward program, both run on the CPU backend.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "passes/autodiff.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "tests/autodiff/autodiff_util.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using namespace autodiff_test;
using passes::BackwardSpec;
using passes::build_backward;
using testing::add_node;

// ---- Numerical check against finite differences -------------------------------------------------

rt::Tensor to_tensor(const ir::Value& v) {
  rt::Tensor t = rt::Tensor::owned(v.dtype, v.shape);
  auto bytes = v.initializer->bytes();
  REQUIRE(static_cast<int64_t>(bytes.size()) == t.bytes());
  std::memcpy(t.data, bytes.data(), bytes.size());
  return t;
}

rt::Tensor random_tensor(const rt::Shape& shape, unsigned seed) {
  rt::Tensor t = rt::Tensor::owned(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = u(rng);
  return t;
}

/// A tensor for an unbound input: uniform in [-1, 1) for floats; small indices (0..6) for int64.
rt::Tensor any_input(const ir::Value& v, unsigned seed) {
  if (v.dtype == DType::kFloat32) return random_tensor(v.shape, seed);
  REQUIRE_MESSAGE(v.dtype == DType::kInt64,
                  "no test data for '" << v.name << "' of " << dtype_name(v.dtype));
  rt::Tensor t = rt::Tensor::owned(DType::kInt64, v.shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<int64_t>()[i] = (5 * i + 2) % 7;
  return t;
}

/// Runs `program` on the tensors named in `bound` (by input name).
std::map<std::string, rt::Tensor> run(const rt::Program& program,
                                      const std::map<std::string, rt::Tensor>& bound) {
  std::vector<rt::Tensor> args;
  for (const rt::ValueInfo& in : program.inputs()) {
    auto it = bound.find(in.name);
    REQUIRE_MESSAGE(it != bound.end(), "nothing bound to input '" << in.name << "'");
    args.push_back(it->second);
  }
  auto device = rt::cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<std::size_t>(program.arena_bytes()) + 64);
  std::vector<rt::Tensor> outs = program.run(*device, args, arena.data());
  std::map<std::string, rt::Tensor> named;
  for (std::size_t k = 0; k < outs.size(); ++k) named[program.outputs()[k].name] = outs[k];
  return named;
}

/// Checks every gradient the backward program of `spec` outputs against central differences of
/// L = loss + sum over the seeded outputs V of 0.5 |V - t_V|^2 (random targets t_V), with the
/// seeds dL/dloss = 1 and dL/dV = V - t_V. `inputs` binds the graph inputs. Returns false (with
/// a MESSAGE) when the cpu backend lacks a kernel the programs need. At most `samples_per_value`
/// elements of each wanted value are perturbed (evenly spread), by +-eps.
bool check_numerically(const ir::Graph& g, const BackwardSpec& spec,
                       std::map<std::string, rt::Tensor> bound, int64_t samples_per_value = 1 << 30,
                       double eps = 1e-3) {
  onnx::ModelProto backward = build_backward(g, spec);
  // The forward program takes the weights as inputs (so they can be perturbed) and returns every
  // forward value the backward program reads.
  ir::ExportOptions fo;
  fo.weights = ir::WeightMode::kAsInputs;
  fo.nodes = spec.nodes;
  onnx::ModelProto forward = ir::model_from_graph(g, fo);
  std::set<std::string> needed;
  for (const auto& in : backward.graph().input()) needed.insert(in.name());
  if (spec.loss) needed.insert(g.value(*spec.loss).name);
  for (ir::ValueId v : spec.output_grads) needed.insert(g.value(v).name);
  auto* fg = forward.mutable_graph();
  std::set<std::string> outputs;
  for (const auto& o : fg->output()) outputs.insert(o.name());
  for (int i = 0; i < fg->value_info_size();) {
    if (needed.count(fg->value_info(i).name()) && !outputs.count(fg->value_info(i).name())) {
      *fg->add_output() = fg->value_info(i);
      fg->mutable_value_info()->DeleteSubrange(i, 1);
    } else {
      ++i;
    }
  }
  std::optional<rt::Program> fp, bp;
  try {
    fp.emplace(rt::Program::from_model(forward, rt::cpu_backend(), "forward.onnx"));
    bp.emplace(rt::Program::from_model(backward, rt::cpu_backend(), "backward.onnx"));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUnsupported) throw;
    MESSAGE("numerical check skipped: the cpu backend lacks a kernel: " << std::string(e.what()));
    return false;
  }
  unsigned input_seed = 50;
  for (const auto& in : fp->inputs()) {
    if (bound.count(in.name)) continue;
    auto v = g.find_value(in.name);
    REQUIRE(v.has_value());
    bound[in.name] = g.value(*v).is_initializer() ? to_tensor(g.value(*v))
                                                  : any_input(g.value(*v), input_seed++);
  }
  std::map<std::string, rt::Tensor> targets;
  unsigned seed = 100;
  for (ir::ValueId v : spec.output_grads)
    targets[g.value(v).name] = random_tensor(g.value(v).shape, seed++);

  auto loss = [&](const std::map<std::string, rt::Tensor>& in) {
    auto out = run(*fp, in);
    double l = spec.loss ? out.at(g.value(*spec.loss).name).as<float>()[0] : 0.0;
    for (const auto& [name, t] : targets) {
      const rt::Tensor& y = out.at(name);
      for (int64_t i = 0; i < y.numel(); ++i) {
        double d = static_cast<double>(y.as<float>()[i]) - t.as<float>()[i];
        l += 0.5 * d * d;
      }
    }
    return l;
  };

  std::map<std::string, rt::Tensor> bwd_in = bound;
  for (const auto& [name, t] : run(*fp, bound)) bwd_in[name] = t;
  for (const auto& [name, t] : targets) {
    rt::Tensor dy = rt::clone(bwd_in.at(name));
    for (int64_t i = 0; i < dy.numel(); ++i) dy.as<float>()[i] -= t.as<float>()[i];
    bwd_in[grad::grad_name(name)] = dy;
  }
  if (spec.loss) {
    rt::Tensor one = rt::Tensor::owned(DType::kFloat32, {});
    one.as<float>()[0] = 1.0f;
    bwd_in[std::string(grad::kLossGradName)] = one;
  }
  auto grads = run(*bp, bwd_in);

  for (ir::ValueId w : spec.wanted) {
    const std::string& name = g.value(w).name;
    CAPTURE(name);
    REQUIRE(grads.count(name + "@grad"));
    const rt::Tensor& grad = grads.at(name + "@grad");
    rt::Tensor& param = bound.at(name);
    param = rt::clone(param);
    double largest = 0;
    const int64_t stride = std::max<int64_t>(1, param.numel() / samples_per_value);
    for (int64_t i = 0; i < param.numel(); i += stride) {
      float keep = param.as<float>()[i];
      param.as<float>()[i] = keep + static_cast<float>(eps);
      double up = loss(bound);
      param.as<float>()[i] = keep - static_cast<float>(eps);
      double down = loss(bound);
      param.as<float>()[i] = keep;
      double fd = (up - down) / (2 * eps);
      double got = grad.as<float>()[i];
      largest = std::max(largest, std::abs(fd));
      CAPTURE(i);
      CHECK(std::abs(got - fd) <= 2e-3 + 2e-2 * std::abs(fd));
    }
    CHECK(largest > 1e-4);  // the check compares something
  }
  return true;
}

TEST_CASE("numerically: toy.onnx, weights and input, 0.5 |y - t|^2 (Gemm, Relu, B/W split)") {
  ImportOptions options;
  options.batch = 3;
  ir::Graph g = import_model(sample("toy.onnx"), options).graph;
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.output_grads = {value(g, "y")};
  check_numerically(g, spec, {{"x", random_tensor(g.value(value(g, "x")).shape, 7)}});
}

TEST_CASE("numerically: accumulation over a value read three times and a tied weight") {
  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "x", kFloat, {2, 4});
  testing::add_float_initializer(gp, "W", {4, 4});
  add_node(gp, "Relu", {"x"}, {"a"}, "relu");
  add_node(gp, "Mul", {"x", "x"}, {"b"}, "square");
  add_node(gp, "Add", {"a", "b"}, {"c"}, "sum");
  add_node(gp, "MatMul", {"c", "W"}, {"d"}, "mm1");
  add_node(gp, "MatMul", {"d", "W"}, {"y"}, "mm2");
  testing::add_tensor_info(gp->add_output(), "y", kFloat, {2, 4});
  ir::Graph g = import_proto(model);
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.output_grads = {value(g, "y")};
  check_numerically(g, spec, {{"x", random_tensor({2, 4}, 3)}});
}

TEST_CASE("numerically: a loss stage (Gemm, SoftmaxCrossEntropyLoss) seeded with loss@grad") {
  ir::Graph g = import_proto(loss_stage_model());
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.loss = value(g, "loss");
  rt::Tensor labels = rt::Tensor::owned(DType::kInt64, {4});
  for (int i = 0; i < 4; ++i) labels.as<int64_t>()[i] = (3 * i + 1) % 5;
  check_numerically(g, spec, {{"x", random_tensor({4, 6}, 5)}, {"labels", labels}});
}

TEST_CASE("numerically: gpt_tiny.onnx, sampled elements of every weight, seeded at its outputs") {
  ImportOptions options;
  options.batch = 1;
  options.dims["seq"] = 4;
  ir::Graph g = import_model(sample("gpt_tiny.onnx"), options).graph;
  BackwardSpec spec = whole_graph_spec(g);
  for (ir::ValueId out : g.outputs) {
    if (is_floating(g.value(out).dtype)) spec.output_grads.push_back(out);
  }
  // Float32 rounding over a few thousand outputs swamps differences at eps = 1e-3.
  check_numerically(g, spec, {}, 4, 1e-2);
}

TEST_CASE("numerically: gpt_tiny.onnx in two stages, activations sent back included") {
  ImportOptions options;
  options.batch = 1;
  options.dims["seq"] = 4;
  ir::Graph g = import_model(sample("gpt_tiny.onnx"), options).graph;
  std::vector<int> stage_of = two_stages(g);
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    check_numerically(g, stage_spec(g, stage_of, s), {}, 3, 1e-2);
  }
}

}  // namespace
}  // namespace stagecraft
