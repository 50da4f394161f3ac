// Finite-difference checks of the data family's gradient kernels (runtime/cpu/grad_data.cpp).
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <random>

#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/grad_ops.h"
#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

void set_int(onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void set_ints(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t i : v) a->add_ints(i);
}

GradCase make_case(const std::string& op, std::vector<Tensor> inputs, std::vector<bool> check,
                   std::function<void(onnx::NodeProto&)> attrs = {}, int opset = 17,
                   int outputs = 1) {
  GradCase c;
  c.op = op;
  c.inputs = std::move(inputs);
  c.check = std::move(check);
  c.attrs = std::move(attrs);
  c.opset = opset;
  c.outputs = outputs;
  return c;
}

// --- gradcheck with constant int64 inputs
// ---------------------------------------------------------- gradcheck (tests/grad/gradcheck.cpp)
// feeds every forward input as a graph input, so ONNX shape inference cannot give static output
// shapes for ops whose shape comes from an input's values (Reshape, Expand, Slice from opset 10).
// This variant makes the int64 inputs initializers of the forward model, and can leave output
// gradients out (`no_dy`: dy_j is "" and y_j is left out of the loss); otherwise it is the same
// check.

void set_type(onnx::ValueInfoProto* info, const std::string& name, DType dtype,
              const Shape& shape) {
  info->set_name(name);
  auto* tt = info->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(dtype));
  auto* s = tt->mutable_shape();
  for (int64_t d : shape) s->add_dim()->set_dim_value(d);
}

onnx::ModelProto new_model(int opset) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  auto* def = model.add_opset_import();
  def->set_domain("");
  def->set_version(opset);
  auto* g = model.add_opset_import();
  g->set_domain(std::string(grad::kGradDomain));
  g->set_version(grad::kGradDomainVersion);
  model.mutable_graph()->set_name("gradcheck_const");
  return model;
}

std::vector<Tensor> run(const onnx::ModelProto& model, const std::vector<Tensor>& inputs) {
  rt::Program p = rt::Program::from_model(model, rt::cpu_backend(), "gradcheck_const");
  auto device = rt::cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(p.arena_bytes()) + 64);
  return p.run(*device, inputs, arena.data());
}

void gradcheck_const(const GradCase& c, const std::vector<bool>& no_dy = {}) {
  CAPTURE(c.op);
  const int n = static_cast<int>(c.inputs.size());
  auto is_const = [&](int k) { return c.inputs[k].dtype == DType::kInt64; };
  onnx::ModelProto fwd = new_model(c.opset);
  auto* g = fwd.mutable_graph();
  onnx::NodeProto* node = g->add_node();
  node->set_op_type(c.op);
  node->set_name("f");
  std::vector<Tensor> present;  // graph inputs of the forward model
  for (int k = 0; k < n; ++k) {
    if (c.inputs[k].dtype == DType::kUndefined) {
      node->add_input("");
      continue;
    }
    const std::string name = fmt::format("x{}", k);
    node->add_input(name);
    if (is_const(k)) {
      onnx::TensorProto* init = g->add_initializer();
      init->set_name(name);
      init->set_data_type(static_cast<int32_t>(DType::kInt64));
      for (int64_t d : c.inputs[k].shape) init->add_dims(d);
      for (int64_t i = 0; i < c.inputs[k].numel(); ++i)
        init->add_int64_data(c.inputs[k].as<int64_t>()[i]);
      continue;
    }
    set_type(g->add_input(), name, c.inputs[k].dtype, c.inputs[k].shape);
    present.push_back(c.inputs[k]);
  }
  for (int j = 0; j < c.outputs; ++j) node->add_output(fmt::format("y{}", j));
  if (c.attrs) c.attrs(*node);
  for (int j = 0; j < c.outputs; ++j) g->add_output()->set_name(fmt::format("y{}", j));
  onnx::shape_inference::InferShapes(fwd);

  std::vector<Tensor> ys = run(fwd, present);
  std::vector<Tensor> rs;
  auto skipped = [&](int j) { return j < static_cast<int>(no_dy.size()) && no_dy[j]; };
  for (int j = 0; j < c.outputs; ++j) rs.push_back(random_tensor(ys[j].shape, -1, 1, 100 + j));
  auto loss = [&](const std::vector<Tensor>& inputs) {
    std::vector<Tensor> out = run(fwd, inputs);
    double l = 0;
    for (int j = 0; j < c.outputs; ++j)
      if (!skipped(j))
        for (int64_t i = 0; i < out[j].numel(); ++i)
          l += static_cast<double>(out[j].as<float>()[i]) * rs[j].as<float>()[i];
    return l;
  };

  onnx::ModelProto bwd = new_model(c.opset);
  auto* gb = bwd.mutable_graph();
  onnx::NodeProto* gn = gb->add_node();
  gn->set_op_type(c.op + std::string(grad::kGradSuffix));
  gn->set_domain(std::string(grad::kGradDomain));
  gn->set_name("f_grad");
  for (const auto& a : node->attribute()) *gn->add_attribute() = a;
  set_int(*gn, std::string(grad::kForwardInputsAttr), n);
  std::vector<Tensor> bwd_inputs;
  auto add_input = [&](const std::string& name, const Tensor& t) {
    gn->add_input(name);
    set_type(gb->add_input(), name, t.dtype, t.shape);
    bwd_inputs.push_back(t);
  };
  for (int k = 0; k < n; ++k) {
    if (c.inputs[k].dtype == DType::kUndefined)
      gn->add_input("");
    else
      add_input(fmt::format("x{}", k), c.inputs[k]);
  }
  for (int j = 0; j < c.outputs; ++j) add_input(fmt::format("y{}", j), ys[j]);
  for (int j = 0; j < c.outputs; ++j) {
    if (skipped(j))
      gn->add_input("");
    else
      add_input(fmt::format("dy{}", j), rs[j]);
  }
  std::vector<int> checked;
  for (int k = 0; k < n; ++k) {
    const bool want = k < static_cast<int>(c.check.size()) && c.check[k];
    gn->add_output(want ? fmt::format("dx{}", k) : "");
    if (want) {
      set_type(gb->add_output(), fmt::format("dx{}", k), c.inputs[k].dtype, c.inputs[k].shape);
      checked.push_back(k);
    }
  }
  std::vector<Tensor> dxs = run(bwd, bwd_inputs);
  REQUIRE(dxs.size() == checked.size());
  std::mt19937 rng(7);
  for (size_t idx = 0; idx < checked.size(); ++idx) {
    const int k = checked[idx];
    CAPTURE(k);
    int present_index = 0;
    for (int i = 0; i < k; ++i)
      present_index += c.inputs[i].dtype != DType::kUndefined && !is_const(i);
    const Tensor& x = c.inputs[k];
    const int64_t count = x.numel();
    const int samples = static_cast<int>(std::min<int64_t>(count, c.samples));
    for (int s = 0; s < samples; ++s) {
      const int64_t e = samples == count ? s : static_cast<int64_t>(rng() % count);
      std::vector<Tensor> plus = present, minus = present;
      plus[present_index] = rt::clone(x);
      minus[present_index] = rt::clone(x);
      plus[present_index].as<float>()[e] += static_cast<float>(c.eps);
      minus[present_index].as<float>()[e] -= static_cast<float>(c.eps);
      const double numeric = (loss(plus) - loss(minus)) / (2 * c.eps);
      const double analytic = dxs[idx].as<float>()[e];
      CAPTURE(e);
      CAPTURE(numeric);
      CAPTURE(analytic);
      CHECK(std::fabs(numeric - analytic) <= c.atol + c.rtol * std::fabs(numeric));
    }
  }
}

}  // namespace

TEST_CASE("grad Identity") { gradcheck(make_case("Identity", {random_tensor({2, 3})}, {true})); }

TEST_CASE("grad Reshape") {
  gradcheck_const(
      make_case("Reshape", {random_tensor({2, 3, 4}), int64_tensor({2}, {4, -1})}, {true, false}));
  gradcheck_const(make_case("Reshape", {random_tensor({2, 3, 4}), int64_tensor({3}, {0, 12, 1})},
                            {true, false}));
}

TEST_CASE("grad Flatten") {
  gradcheck(make_case("Flatten", {random_tensor({2, 3, 4})}, {true}));
  gradcheck(make_case("Flatten", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_int(n, "axis", 0); }));
  gradcheck(make_case("Flatten", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_int(n, "axis", -1); }));
}

TEST_CASE("grad Squeeze") {
  gradcheck_const(
      make_case("Squeeze", {random_tensor({2, 1, 4, 1}), int64_tensor({1}, {-1})}, {true, false}));
  gradcheck(make_case("Squeeze", {random_tensor({2, 1, 4, 1})}, {true}));
  gradcheck(make_case(
      "Squeeze", {random_tensor({2, 1, 4, 1})}, {true},
      [](onnx::NodeProto& n) { set_ints(n, "axes", {1}); }, 11));
}

TEST_CASE("grad Unsqueeze") {
  gradcheck_const(
      make_case("Unsqueeze", {random_tensor({2, 4}), int64_tensor({2}, {0, -1})}, {true, false}));
  gradcheck(make_case(
      "Unsqueeze", {random_tensor({2, 4})}, {true},
      [](onnx::NodeProto& n) { set_ints(n, "axes", {1}); }, 11));
}

TEST_CASE("grad Transpose") {
  gradcheck(make_case("Transpose", {random_tensor({2, 3, 4})}, {true}));
  gradcheck(make_case("Transpose", {random_tensor({2, 3, 4, 5})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "perm", {0, 2, 3, 1});
  }));
  gradcheck(make_case("Transpose", {random_tensor({2, 3, 4, 5})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "perm", {2, 0, 3, 1});
  }));
  gradcheck(make_case("Transpose", {random_tensor({3, 1, 4})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "perm", {1, 2, 0});
  }));
}

TEST_CASE("grad Concat") {
  gradcheck(make_case("Concat", {random_tensor({3}, -1, 1, 1), random_tensor({2}, -1, 1, 2)},
                      {true, true}, [](onnx::NodeProto& n) { set_int(n, "axis", 0); }));
  auto axis = [](int64_t v) { return [v](onnx::NodeProto& n) { set_int(n, "axis", v); }; };
  gradcheck(make_case("Concat",
                      {random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({2, 5, 4}, -1, 1, 2)},
                      {true, true}, axis(1)));
  gradcheck(make_case("Concat",
                      {random_tensor({2, 3}, -1, 1, 1), random_tensor({1, 3}, -1, 1, 2),
                       random_tensor({3, 3}, -1, 1, 3)},
                      {true, false, true}, axis(0)));
  gradcheck(make_case("Concat", {random_tensor({2, 3}, -1, 1, 1), random_tensor({2, 2}, -1, 1, 2)},
                      {true, true}, axis(-1)));
}

TEST_CASE("grad Split") {
  SUBCASE("equal parts") {
    gradcheck(make_case(
        "Split", {random_tensor({2, 6, 3})}, {true},
        [](onnx::NodeProto& n) { set_int(n, "axis", 1); }, 17, 3));
  }
  SUBCASE("equal parts, default axis (opset 13)") {
    gradcheck(make_case("Split", {random_tensor({4, 3})}, {true}, {}, 13, 2));
  }
  SUBCASE("split attribute (opset 11), last axis") {
    gradcheck(make_case(
        "Split", {random_tensor({2, 3, 5})}, {true},
        [](onnx::NodeProto& n) {
          set_int(n, "axis", -1);
          set_ints(n, "split", {1, 4});
        },
        11, 2));
  }
  SUBCASE("split input (opset 13)") {
    gradcheck_const(make_case("Split", {random_tensor({6, 2}), int64_tensor({3}, {1, 3, 2})},
                              {true, false}, {}, 13, 3));
  }
  SUBCASE("an omitted output gradient") {
    gradcheck_const(make_case(
                        "Split", {random_tensor({4, 3})}, {true},
                        [](onnx::NodeProto& n) {
                          set_ints(n, "split", {1, 2, 1});
                        },
                        11, 3),
                    {false, true, false});
  }
}

TEST_CASE("grad Slice") {
  SUBCASE("opset 1 attributes") {
    gradcheck(make_case(
        "Slice", {random_tensor({4, 5, 3})}, {true},
        [](onnx::NodeProto& n) {
          set_ints(n, "starts", {1, 1});
          set_ints(n, "ends", {3, 5});
          set_ints(n, "axes", {0, 1});
        },
        1));
  }
  SUBCASE("inputs with steps") {
    gradcheck_const(
        make_case("Slice",
                  {random_tensor({6, 5, 4}), int64_tensor({2}, {0, 1}), int64_tensor({2}, {6, 4}),
                   int64_tensor({2}, {0, 2}), int64_tensor({2}, {2, 2})},
                  {true, false, false, false, false}));
  }
  SUBCASE("negative step, default axes") {
    gradcheck_const(make_case("Slice",
                              {random_tensor({5, 4}), int64_tensor({2}, {4, -1}),
                               int64_tensor({2}, {0, -5}), Tensor{}, int64_tensor({2}, {-2, -1})},
                              {true, false, false, false, false}));
  }
  SUBCASE("negative starts, ends past the dims") {
    gradcheck_const(make_case("Slice",
                              {random_tensor({4, 6}), int64_tensor({2}, {-3, 2}),
                               int64_tensor({2}, {100, -1}), int64_tensor({2}, {0, 1})},
                              {true, false, false, false}));
  }
  SUBCASE("starts and ends only") {
    gradcheck_const(make_case(
        "Slice", {random_tensor({3, 6}), int64_tensor({2}, {1, 2}), int64_tensor({2}, {3, 5})},
        {true, false, false}));
  }
}

TEST_CASE("grad Gather") {
  SUBCASE("axis 0, repeated and negative indices") {
    gradcheck_const(make_case("Gather",
                              {random_tensor({5, 3}), int64_tensor({2, 3}, {0, 4, -1, 2, 0, 0})},
                              {true, false}));
  }
  SUBCASE("axis 1") {
    gradcheck_const(make_case("Gather", {random_tensor({2, 4, 3}), int64_tensor({3}, {3, 1, 3})},
                              {true, false}, [](onnx::NodeProto& n) { set_int(n, "axis", 1); }));
  }
  SUBCASE("scalar index, last axis") {
    gradcheck_const(make_case("Gather", {random_tensor({2, 4}), int64_tensor({}, {-2})},
                              {true, false}, [](onnx::NodeProto& n) { set_int(n, "axis", -1); }));
  }
  SUBCASE("indices as a graph input") {
    gradcheck(make_case("Gather", {random_tensor({6, 2}), int64_tensor({4}, {5, 1, 1, 0})},
                        {true, false}));
  }
}

TEST_CASE("grad data: large (threaded paths)") {
  auto large = [](GradCase c) {
    c.samples = 12;
    return c;
  };
  gradcheck(
      large(make_case("Transpose", {random_tensor({40, 30, 30})}, {true}, [](onnx::NodeProto& n) {
        set_ints(n, "perm", {2, 0, 1});
      })));
  std::vector<int64_t> indices(60);
  for (int64_t i = 0; i < 60; ++i) indices[i] = (i * 7) % 10 - 5;  // repeats and negatives
  GradCase gather =
      make_case("Gather", {random_tensor({10, 600}), int64_tensor({60}, indices)}, {true, false});
  gather.samples = 40;
  gradcheck_const(gather);
  gradcheck(large(make_case("ReduceMean", {random_tensor({30, 40, 30})}, {true},
                            [](onnx::NodeProto& n) { set_ints(n, "axes", {1}); })));
  gradcheck_const(large(make_case(
      "Expand", {random_tensor({40, 1, 30}), int64_tensor({3}, {40, 30, 30})}, {true, false})));
}

TEST_CASE("grad Expand") {
  gradcheck_const(
      make_case("Expand", {random_tensor({3, 1}), int64_tensor({3}, {2, 3, 4})}, {true, false}));
  gradcheck_const(
      make_case("Expand", {random_tensor({1, 4}), int64_tensor({2}, {3, 1})}, {true, false}));
  gradcheck_const(
      make_case("Expand", {random_tensor({}), int64_tensor({2}, {2, 3})}, {true, false}));
  gradcheck_const(
      make_case("Expand", {random_tensor({2, 3}), int64_tensor({2}, {2, 3})}, {true, false}));
}

TEST_CASE("grad ReduceMean") {
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true}));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_ints(n, "axes", {-1}); }));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "axes", {0, 2});
    set_int(n, "keepdims", 0);
  }));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "axes", {1});
    set_int(n, "keepdims", 0);
  }));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_int(n, "keepdims", 0); }));
}

}  // namespace stagecraft::testing
