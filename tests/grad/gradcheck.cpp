#include "tests/grad/gradcheck.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <random>

#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::testing {

namespace {

void set_type(onnx::ValueInfoProto* info, const std::string& name, DType dtype,
              const rt::Shape& shape) {
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
  model.mutable_graph()->set_name("gradcheck");
  return model;
}

std::vector<rt::Tensor> run(const onnx::ModelProto& model, const std::vector<rt::Tensor>& inputs) {
  rt::Program p = rt::Program::from_model(model, rt::cpu_backend(), "gradcheck");
  auto device = rt::cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(p.arena_bytes()) + 64);
  return p.run(*device, inputs, arena.data());
}

}  // namespace

rt::Tensor random_tensor(const rt::Shape& shape, float lo, float hi, unsigned seed) {
  rt::Tensor t = rt::Tensor::owned(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = u(rng);
  return t;
}

rt::Tensor int64_tensor(const rt::Shape& shape, const std::vector<int64_t>& values) {
  rt::Tensor t = rt::Tensor::owned(DType::kInt64, shape);
  REQUIRE(static_cast<int64_t>(values.size()) == t.numel());
  std::copy(values.begin(), values.end(), t.as<int64_t>());
  return t;
}

namespace {
onnx::AttributeProto* new_attribute(onnx::NodeProto& node, const std::string& name,
                                    onnx::AttributeProto::AttributeType type) {
  auto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(type);
  return a;
}
}  // namespace

void set_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  new_attribute(node, name, onnx::AttributeProto::INT)->set_i(value);
}

void set_ints(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = new_attribute(node, name, onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void set_float(onnx::NodeProto& node, const std::string& name, float value) {
  new_attribute(node, name, onnx::AttributeProto::FLOAT)->set_f(value);
}

void set_string(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  new_attribute(node, name, onnx::AttributeProto::STRING)->set_s(value);
}

void gradcheck(const GradCase& c) {
  CAPTURE(c.op);
  const int n = static_cast<int>(c.inputs.size());
  // Forward model: present inputs are graph inputs "x0".., outputs "y0"..; shapes inferred.
  onnx::ModelProto fwd = new_model(c.opset);
  auto* g = fwd.mutable_graph();
  onnx::NodeProto* node = g->add_node();
  node->set_op_type(c.op);
  node->set_name("f");
  auto is_const = [&](int k) { return c.int64_as_constants && c.inputs[k].dtype == DType::kInt64; };
  std::vector<rt::Tensor> present;  // graph inputs of the forward model
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
  for (int j = 0; j < c.outputs; ++j)
    REQUIRE_MESSAGE(g->output(j).type().has_tensor_type(), "no inferred type for y", j);

  std::vector<rt::Tensor> ys = run(fwd, present);
  std::vector<rt::Tensor> rs;
  auto wanted_dy = [&](int j) {
    return ys[j].dtype == DType::kFloat32 && !(j < static_cast<int>(c.no_dy.size()) && c.no_dy[j]);
  };
  for (int j = 0; j < c.outputs; ++j)
    rs.push_back(wanted_dy(j) ? random_tensor(ys[j].shape, -1, 1, 100 + j) : rt::Tensor{});
  auto loss = [&](const std::vector<rt::Tensor>& inputs) {
    std::vector<rt::Tensor> out = run(fwd, inputs);
    double l = 0;
    for (int j = 0; j < c.outputs; ++j)
      if (rs[j].dtype == DType::kFloat32)
        for (int64_t i = 0; i < out[j].numel(); ++i)
          l += static_cast<double>(out[j].as<float>()[i]) * rs[j].as<float>()[i];
    return l;
  };

  // Gradient model: TGrad(x..., y..., dy...) -> dx for the checked inputs.
  onnx::ModelProto bwd = new_model(c.opset);
  auto* gb = bwd.mutable_graph();
  onnx::NodeProto* gn = gb->add_node();
  gn->set_op_type(c.op + std::string(grad::kGradSuffix));
  gn->set_domain(std::string(grad::kGradDomain));
  gn->set_name("f_grad");
  for (const auto& a : node->attribute()) *gn->add_attribute() = a;
  auto* fi = gn->add_attribute();
  fi->set_name(std::string(grad::kForwardInputsAttr));
  fi->set_type(onnx::AttributeProto::INT);
  fi->set_i(n);
  std::vector<rt::Tensor> bwd_inputs;
  auto add_input = [&](const std::string& name, const rt::Tensor& t) {
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
    if (rs[j].dtype == DType::kFloat32)
      add_input(fmt::format("dy{}", j), rs[j]);
    else
      gn->add_input("");
  }
  std::vector<int> checked;
  for (int k = 0; k < n; ++k) {
    bool want = k < static_cast<int>(c.check.size()) && c.check[k];
    gn->add_output(want ? fmt::format("dx{}", k) : "");
    if (want) {
      set_type(gb->add_output(), fmt::format("dx{}", k), c.inputs[k].dtype, c.inputs[k].shape);
      checked.push_back(k);
    }
  }
  std::vector<rt::Tensor> dxs = run(bwd, bwd_inputs);
  REQUIRE(dxs.size() == checked.size());

  std::mt19937 rng(7);
  for (size_t idx = 0; idx < checked.size(); ++idx) {
    int k = checked[idx];
    CAPTURE(k);
    int present_index = 0;
    for (int i = 0; i < k; ++i)
      present_index += c.inputs[i].dtype != DType::kUndefined && !is_const(i);
    const rt::Tensor& x = c.inputs[k];
    int64_t count = x.numel();
    int samples = static_cast<int>(std::min<int64_t>(count, c.samples));
    for (int s = 0; s < samples; ++s) {
      int64_t e = samples == count ? s : static_cast<int64_t>(rng() % count);
      std::vector<rt::Tensor> plus = present, minus = present;
      plus[present_index] = rt::clone(x);
      minus[present_index] = rt::clone(x);
      plus[present_index].as<float>()[e] += static_cast<float>(c.eps);
      minus[present_index].as<float>()[e] -= static_cast<float>(c.eps);
      double numeric = (loss(plus) - loss(minus)) / (2 * c.eps);
      double analytic = dxs[idx].as<float>()[e];
      CAPTURE(e);
      CAPTURE(numeric);
      CAPTURE(analytic);
      CHECK(std::fabs(numeric - analytic) <= c.atol + c.rtol * std::fabs(numeric));
    }
  }
}

}  // namespace stagecraft::testing
