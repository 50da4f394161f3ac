#include "tests/grad/gradcheck.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <cstring>
#include <memory>
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

// Runs `model` with its intermediates in an arena whose bytes start as `arena_byte`.
std::vector<rt::Tensor> run(const onnx::ModelProto& model, const std::vector<rt::Tensor>& inputs,
                            const rt::Backend& backend = rt::cpu_backend(),
                            std::byte arena_byte = std::byte{0}) {
  rt::Program p = rt::Program::from_model(model, backend, "gradcheck");
  auto device = backend.make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(p.arena_bytes()) + 64, arena_byte);
  return p.run(*device, inputs, arena.data());
}

// Every byte 0xff: a float32 NaN, which no arithmetic turns into a number.
constexpr std::byte kGarbage{0xff};

// The cpu backend, except that every gradient kernel adds its results into the outputs it is
// given (as a kernel that scatters does) and its entry leaves writes_every_output false: run on
// outputs the runtime did not zero, it gives garbage.
class AccumulatingBackend : public rt::Backend {
 public:
  AccumulatingBackend() {
    for (rt::KernelEntry e : rt::cpu_backend().table()) {
      if (e.op_type.ends_with(grad::kGradSuffix)) {
        e.run = accumulate;
        e.writes_every_output = false;
      }
      table_.push_back(e);
    }
  }
  std::string_view name() const override { return "cpu (gradients accumulating)"; }
  std::span<const rt::KernelEntry> table() const override { return table_; }
  std::unique_ptr<rt::DeviceContext> make_device(int device, int threads) const override {
    return rt::cpu_backend().make_device(device, threads);
  }

 private:
  static void accumulate(const rt::KernelArgs& a) {
    std::vector<rt::Tensor> results;
    results.reserve(a.out.size());
    std::vector<rt::Tensor*> out;
    for (rt::Tensor* t : a.out) {
      out.push_back(t ? &results.emplace_back(rt::Tensor::owned(t->dtype, t->shape)) : nullptr);
    }
    rt::cpu_backend().kernel(a.op_type)({a.name, a.op_type, a.attrs, a.in, out, a.device});
    for (size_t k = 0; k < out.size(); ++k)
      if (out[k] != nullptr)
        for (int64_t i = 0; i < out[k]->numel(); ++i)
          a.out[k]->as<float>()[i] += out[k]->as<float>()[i];
  }
  std::vector<rt::KernelEntry> table_;
};

// Calls the gradient node's kernel directly: `in` per node input (null where omitted), `out`
// per node output (null where not wanted).
void call_kernel(const onnx::NodeProto& node, const std::vector<const rt::Tensor*>& in,
                 const std::vector<rt::Tensor*>& out) {
  rt::Attrs attrs(node);
  auto device = rt::cpu_backend().make_device(0, 1);
  rt::cpu_backend().kernel(node.op_type())({node.name(), node.op_type(), attrs, in, out, *device});
}

void fill(std::vector<rt::Tensor*>& out, std::byte value) {
  for (rt::Tensor* t : out)
    if (t != nullptr)
      std::memset(t->data, static_cast<int>(value), static_cast<size_t>(t->bytes()));
}

// The first element i of float32 tensor `t` for which `bad(i, value)` holds, or -1.
template <class Bad>
int64_t first_bad(const rt::Tensor& t, Bad bad) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (bad(i, t.as<float>()[i])) return i;
  return -1;
}

// What a kernel whose entry says writes_every_output promises (the runtime then hands it
// outputs holding whatever the arena held): its outputs do not depend on their starting bytes.
// Run on outputs of NaN, it gives bit for bit what it gives on zeros; with every dy omitted,
// it gives zeros. `in` and `out` as `call_kernel`'s, with `m` forward outputs.
void check_writes_every_output(const onnx::NodeProto& node, size_t m,
                               std::vector<const rt::Tensor*> in, std::vector<rt::Tensor*> out) {
  const rt::KernelEntry& entry = rt::cpu_backend().entry(node.op_type());
  if (!entry.writes_every_output) return;
  CAPTURE(node.op_type());
  fill(out, std::byte{0});
  call_kernel(node, in, out);
  std::vector<rt::Tensor> on_zeros;
  for (rt::Tensor* t : out) on_zeros.push_back(t ? rt::clone(*t) : rt::Tensor{});
  fill(out, kGarbage);
  call_kernel(node, in, out);
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k] == nullptr) continue;
    CAPTURE(k);
    const float* want = on_zeros[k].as<float>();
    const int64_t first_diff = first_bad(*out[k], [&](int64_t i, float got) {
      return std::memcmp(&got, want + i, sizeof(float)) != 0;
    });
    CHECK_MESSAGE(first_diff < 0, "marked writes_every_output, but output ", k, " element ",
                  first_diff, " depends on the output's starting bytes");
  }
  // Every dy omitted: all gradients are zero.
  const size_t n = out.size();
  for (size_t j = 0; j < m; ++j) in[n + m + j] = nullptr;
  fill(out, kGarbage);
  call_kernel(node, in, out);
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k] == nullptr) continue;
    CAPTURE(k);
    const int64_t nonzero = first_bad(*out[k], [](int64_t, float got) { return !(got == 0.0f); });
    CHECK_MESSAGE(nonzero < 0, "with every dy omitted, output ", k, " element ", nonzero,
                  " is not zero");
  }
}

// The backward model with every dx routed through an Identity, so the gradient node's outputs
// are intermediates placed in the program's arena rather than graph outputs of their own.
onnx::ModelProto with_outputs_in_arena(onnx::ModelProto model) {
  auto* g = model.mutable_graph();
  const auto outputs = g->output();
  g->clear_output();
  for (const onnx::ValueInfoProto& dx : outputs) {
    *g->add_value_info() = dx;
    onnx::NodeProto* copy = g->add_node();
    copy->set_op_type("Identity");
    copy->set_name(dx.name() + "_copy");
    copy->add_input(dx.name());
    copy->add_output(dx.name() + "_out");
    onnx::ValueInfoProto* out = g->add_output();
    *out = dx;
    out->set_name(dx.name() + "_out");
  }
  return model;
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
  std::vector<const rt::Tensor*> kernel_in;  // per gradient-node input, for direct calls
  auto add_input = [&](const std::string& name, const rt::Tensor& t) {
    gn->add_input(name);
    set_type(gb->add_input(), name, t.dtype, t.shape);
    bwd_inputs.push_back(t);
    kernel_in.push_back(&t);
  };
  auto omit_input = [&] {
    gn->add_input("");
    kernel_in.push_back(nullptr);
  };
  for (int k = 0; k < n; ++k) {
    if (c.inputs[k].dtype == DType::kUndefined)
      omit_input();
    else
      add_input(fmt::format("x{}", k), c.inputs[k]);
  }
  for (int j = 0; j < c.outputs; ++j) add_input(fmt::format("y{}", j), ys[j]);
  for (int j = 0; j < c.outputs; ++j) {
    if (rs[j].dtype == DType::kFloat32)
      add_input(fmt::format("dy{}", j), rs[j]);
    else
      omit_input();
  }
  std::vector<int> checked;
  std::vector<rt::Tensor> kernel_out_tensors(static_cast<size_t>(n));
  std::vector<rt::Tensor*> kernel_out;  // per gradient-node output, for direct calls
  for (int k = 0; k < n; ++k) {
    bool want = k < static_cast<int>(c.check.size()) && c.check[k];
    gn->add_output(want ? fmt::format("dx{}", k) : "");
    kernel_out.push_back(nullptr);
    if (want) {
      set_type(gb->add_output(), fmt::format("dx{}", k), c.inputs[k].dtype, c.inputs[k].shape);
      checked.push_back(k);
      kernel_out_tensors[k] = rt::Tensor::owned(c.inputs[k].dtype, c.inputs[k].shape);
      kernel_out.back() = &kernel_out_tensors[k];
    }
  }
  std::vector<rt::Tensor> dxs = run(bwd, bwd_inputs);
  REQUIRE(dxs.size() == checked.size());

  check_writes_every_output(*gn, static_cast<size_t>(c.outputs), kernel_in, kernel_out);
  {
    // A kernel that leaves writes_every_output false gets outputs the runtime zero-filled, even
    // where they lie in an arena of garbage: the same gradients as outputs of their own.
    const AccumulatingBackend accumulating;
    std::vector<rt::Tensor> in_arena =
        run(with_outputs_in_arena(bwd), bwd_inputs, accumulating, kGarbage);
    REQUIRE(in_arena.size() == dxs.size());
    for (size_t i = 0; i < dxs.size(); ++i) {
      CAPTURE(checked[i]);
      const float* want = dxs[i].as<float>();
      const int64_t first_diff =
          first_bad(in_arena[i], [&](int64_t e, float got) { return !(got == want[e]); });
      CHECK_MESSAGE(first_diff < 0,
                    "an accumulating gradient kernel with outputs in the arena "
                    "differs at element ",
                    first_diff);
    }
  }

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
