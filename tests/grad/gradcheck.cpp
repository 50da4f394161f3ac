#include "tests/grad/gradcheck.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <onnx/shape_inference/implementation.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>

#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/grad_ops.h"
#include "runtime/format/grad_reads.h"

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
  if (device->host_visible()) return p.run(*device, inputs, arena.data());
  // A device of its own memory (CUDA): the arena's starting bytes, the inputs and the weights
  // copied to it, the outputs back.
  auto buffer = device->allocate(static_cast<int64_t>(arena.size()));
  rt::Tensor bytes =
      rt::Tensor::view(DType::kUInt8, {static_cast<int64_t>(arena.size())}, buffer->base());
  device->write(bytes, arena.data(), static_cast<int64_t>(arena.size()));
  return rt::run_from_host(p, *device, inputs, buffer->base());
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
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::span<const rt::KernelEntry> table() const override { return table_; }
  std::unique_ptr<rt::DeviceContext> make_device(int device, int threads) const override {
    return rt::cpu_backend().make_device(device, threads);
  }
  Physical physical_device(int device) const override {
    return rt::cpu_backend().physical_device(device);
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
void call_kernel(const rt::Backend& backend, const onnx::NodeProto& node,
                 const std::vector<const rt::Tensor*>& in, const std::vector<rt::Tensor*>& out) {
  rt::Attrs attrs(node);
  auto device = backend.make_device(0, 1);
  if (device->host_visible()) {
    backend.kernel(node.op_type())({node.name(), node.op_type(), attrs, in, out, *device});
    return;
  }
  // A device of its own memory: the inputs and the outputs' starting bytes copied to it, the
  // outputs back.
  std::vector<rt::Tensor> din, dout;
  din.reserve(in.size());
  dout.reserve(out.size());
  std::vector<const rt::Tensor*> pin;
  std::vector<rt::Tensor*> pout;
  for (const rt::Tensor* t : in)
    pin.push_back(t ? &din.emplace_back(rt::to_device(*device, *t)) : nullptr);
  for (rt::Tensor* t : out)
    pout.push_back(t ? &dout.emplace_back(rt::to_device(*device, *t)) : nullptr);
  backend.kernel(node.op_type())({node.name(), node.op_type(), attrs, pin, pout, *device});
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k] != nullptr) device->read(*pout[k], out[k]->data, out[k]->bytes());
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
void check_writes_every_output(const rt::Backend& backend, const onnx::NodeProto& node, size_t m,
                               std::vector<const rt::Tensor*> in, std::vector<rt::Tensor*> out) {
  const rt::KernelEntry& entry = backend.entry(node.op_type());
  if (!entry.writes_every_output) return;
  CAPTURE(node.op_type());
  fill(out, std::byte{0});
  call_kernel(backend, node, in, out);
  std::vector<rt::Tensor> on_zeros;
  for (rt::Tensor* t : out) on_zeros.push_back(t ? rt::clone(*t) : rt::Tensor{});
  fill(out, kGarbage);
  call_kernel(backend, node, in, out);
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
  call_kernel(backend, node, in, out);
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

namespace {

// The forward model of a case: present inputs are graph inputs "x0".., outputs "y0"..; shapes
// inferred. `present` are the graph inputs' values.
struct Forward {
  onnx::ModelProto model;
  std::vector<rt::Tensor> present;
};

bool is_const(const GradCase& c, int k) {
  return (c.int64_as_constants && c.inputs[k].dtype == DType::kInt64) ||
         (k < static_cast<int>(c.constant.size()) && c.constant[k]);
}

Forward forward_model(const GradCase& c) {
  const int n = static_cast<int>(c.inputs.size());
  Forward f{new_model(c.opset), {}};
  auto* g = f.model.mutable_graph();
  onnx::NodeProto* node = g->add_node();
  node->set_op_type(c.op);
  node->set_domain(c.domain);
  node->set_name("f");
  for (int k = 0; k < n; ++k) {
    if (c.inputs[k].dtype == DType::kUndefined) {
      node->add_input("");
      continue;
    }
    const std::string name = fmt::format("x{}", k);
    node->add_input(name);
    if (is_const(c, k)) {
      onnx::TensorProto* init = g->add_initializer();
      init->set_name(name);
      init->set_data_type(static_cast<int32_t>(c.inputs[k].dtype));
      for (int64_t d : c.inputs[k].shape) init->add_dims(d);
      if (c.inputs[k].bytes() > 0)
        init->set_raw_data(c.inputs[k].data, static_cast<size_t>(c.inputs[k].bytes()));
      continue;
    }
    set_type(g->add_input(), name, c.inputs[k].dtype, c.inputs[k].shape);
    f.present.push_back(c.inputs[k]);
  }
  for (int j = 0; j < c.outputs; ++j) node->add_output(fmt::format("y{}", j));
  if (c.attrs) c.attrs(*node);
  for (int j = 0; j < c.outputs; ++j) {
    onnx::ValueInfoProto* y = g->add_output();
    if (j < static_cast<int>(c.output_shapes.size()))
      set_type(y, fmt::format("y{}", j), DType::kFloat32, c.output_shapes[j]);
    else
      y->set_name(fmt::format("y{}", j));
  }
  if (c.output_shapes.empty()) onnx::shape_inference::InferShapes(f.model);
  for (int j = 0; j < c.outputs; ++j)
    REQUIRE_MESSAGE(g->output(j).type().has_tensor_type(), "no inferred type for y", j);
  return f;
}

// The gradient model TGrad(x..., y..., dy...) -> dx for the checked inputs, its inputs, and
// the gradient node's arguments for direct kernel calls (pointing into `c`, `ys` and `rs`).
struct Gradient {
  onnx::ModelProto model;
  std::vector<rt::Tensor> inputs;
  std::vector<int> checked;                  ///< The inputs whose dx the model outputs.
  std::vector<const rt::Tensor*> kernel_in;  ///< Per gradient-node input.
  std::vector<rt::Tensor> kernel_out_tensors;
  std::vector<rt::Tensor*> kernel_out;  ///< Per gradient-node output.
};

Gradient gradient_model(const GradCase& c, const onnx::NodeProto& node,
                        const std::vector<rt::Tensor>& ys, const std::vector<rt::Tensor>& rs) {
  const int n = static_cast<int>(c.inputs.size());
  Gradient out{new_model(c.opset), {}, {}, {}, std::vector<rt::Tensor>(static_cast<size_t>(n)), {}};
  auto* gb = out.model.mutable_graph();
  onnx::NodeProto* gn = gb->add_node();
  gn->set_op_type(c.op + std::string(grad::kGradSuffix));
  gn->set_domain(std::string(grad::kGradDomain));
  gn->set_name("f_grad");
  for (const auto& a : node.attribute()) *gn->add_attribute() = a;
  auto* fi = gn->add_attribute();
  fi->set_name(std::string(grad::kForwardInputsAttr));
  fi->set_type(onnx::AttributeProto::INT);
  fi->set_i(n);
  // A forward operand whose bytes the gradient does not read (runtime/format/grad_reads.h)
  // goes in bare, as the runtime gives it: its dtype and shape, no bytes.
  auto add_input = [&](const std::string& name, const rt::Tensor& t, bool bare = false) {
    gn->add_input(name);
    set_type(gb->add_input(), name, t.dtype, t.shape);
    out.inputs.push_back(bare ? rt::Tensor::bare(t.dtype, t.shape) : t);
    out.kernel_in.push_back(&t);
  };
  auto bare = [&](int position) { return !grad::reads_bytes(c.op, n, position); };
  auto omit_input = [&] {
    gn->add_input("");
    out.kernel_in.push_back(nullptr);
  };
  for (int k = 0; k < n; ++k) {
    if (c.inputs[k].dtype == DType::kUndefined)
      omit_input();
    else
      add_input(fmt::format("x{}", k), c.inputs[k], bare(k));
  }
  for (int j = 0; j < c.outputs; ++j) add_input(fmt::format("y{}", j), ys[j], bare(n + j));
  for (int j = 0; j < c.outputs; ++j) {
    if (rs[j].dtype == DType::kFloat32)
      add_input(fmt::format("dy{}", j), rs[j]);
    else
      omit_input();
  }
  for (int k = 0; k < n; ++k) {
    bool want = k < static_cast<int>(c.check.size()) && c.check[k];
    gn->add_output(want ? fmt::format("dx{}", k) : "");
    out.kernel_out.push_back(nullptr);
    if (want) {
      set_type(gb->add_output(), fmt::format("dx{}", k), c.inputs[k].dtype, c.inputs[k].shape);
      out.checked.push_back(k);
      out.kernel_out_tensors[k] = rt::Tensor::owned(c.inputs[k].dtype, c.inputs[k].shape);
      out.kernel_out.back() = &out.kernel_out_tensors[k];
    }
  }
  return out;
}

// A kernel that leaves writes_every_output false gets outputs the runtime zero-filled, even
// where they lie in an arena of garbage: the same gradients as outputs of their own. The
// accumulating kernels are the CPU's, so `dxs` must be the CPU backend's gradients (bit for bit
// is only promised between runs of one backend).
void check_zeroed_in_arena(const Gradient& grad, const std::vector<rt::Tensor>& dxs) {
  const AccumulatingBackend accumulating;
  std::vector<rt::Tensor> in_arena =
      run(with_outputs_in_arena(grad.model), grad.inputs, accumulating, kGarbage);
  REQUIRE(in_arena.size() == dxs.size());
  for (size_t i = 0; i < dxs.size(); ++i) {
    CAPTURE(grad.checked[i]);
    const float* want = dxs[i].as<float>();
    const int64_t first_diff =
        first_bad(in_arena[i], [&](int64_t e, float got) { return !(got == want[e]); });
    CHECK_MESSAGE(first_diff < 0,
                  "an accumulating gradient kernel with outputs in the arena differs at element ",
                  first_diff);
  }
}

// The backend under test against the CPU reference: the same outputs within the case's
// tolerance (bit for bit when the backend under test is the CPU's).
void check_against_cpu(const rt::Backend& backend, const onnx::ModelProto& model,
                       const std::vector<rt::Tensor>& inputs, const std::vector<rt::Tensor>& got,
                       const GradCase& c, const char* what) {
  std::vector<rt::Tensor> want = run(model, inputs, rt::cpu_backend());
  REQUIRE(want.size() == got.size());
  const bool exact = &backend == &rt::cpu_backend();
  for (size_t k = 0; k < got.size(); ++k) {
    CAPTURE(what);
    CAPTURE(k);
    REQUIRE(got[k].dtype == want[k].dtype);
    REQUIRE(got[k].shape == want[k].shape);
    if (got[k].dtype != DType::kFloat32) continue;
    const float* w = want[k].as<float>();
    const int64_t bad = first_bad(got[k], [&](int64_t e, float v) {
      return exact ? std::memcmp(&v, w + e, sizeof v) != 0
                   : !(std::fabs(v - w[e]) <= c.atol + c.rtol * std::fabs(w[e]));
    });
    CHECK_MESSAGE(bad < 0, backend.name(), " differs from the cpu reference at element ", bad);
  }
}

// dx against the central difference of the loss at sampled elements of each checked input.
void check_numeric(const GradCase& c, const std::vector<int>& checked,
                   const std::vector<rt::Tensor>& present, const std::vector<rt::Tensor>& dxs,
                   const std::function<double(const std::vector<rt::Tensor>&)>& loss) {
  std::mt19937 rng(7);
  for (size_t idx = 0; idx < checked.size(); ++idx) {
    int k = checked[idx];
    CAPTURE(k);
    int present_index = 0;
    for (int i = 0; i < k; ++i)
      present_index += c.inputs[i].dtype != DType::kUndefined && !is_const(c, i);
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

}  // namespace

std::string test_backend() {
  const char* name = std::getenv("STAGECRAFT_TEST_BACKEND");
  return name != nullptr && *name != '\0' ? name : "cpu";
}

namespace {

// Whether `op` or its gradient op has a kernel on the CPU backend but none on `backend`.
bool lacks_cpu_kernels(const rt::Backend& backend, const std::string& op) {
  auto has = [](const rt::Backend& b, const std::string& type) {
    for (const rt::KernelEntry& e : b.table())
      if (e.op_type == type) return true;
    return false;
  };
  for (const std::string& type : {op, op + std::string(grad::kGradSuffix)})
    if (has(rt::cpu_backend(), type) && !has(backend, type)) return true;
  return false;
}

}  // namespace

void gradcheck(const GradCase& c, const std::string& backend_name) {
  CAPTURE(c.op);
  CAPTURE(backend_name);
  const rt::Backend& tested = rt::backend_by_name(backend_name);
  // An op the CPU gained before the backend under test (listed in
  // tests/gpu/cuda_table_covers_cpu_test.cpp): checked on the CPU alone, and said so.
  const bool cpu_only = lacks_cpu_kernels(tested, c.op);
  if (cpu_only) MESSAGE(c.op << " has no " << tested.name() << " kernel: checked on the cpu only");
  const rt::Backend& backend = cpu_only ? rt::cpu_backend() : tested;
  Forward fwd = forward_model(c);
  std::vector<rt::Tensor> ys = run(fwd.model, fwd.present, backend);
  check_against_cpu(backend, fwd.model, fwd.present, ys, c, "forward");
  std::vector<rt::Tensor> rs;
  auto wanted_dy = [&](int j) {
    return ys[j].dtype == DType::kFloat32 && !(j < static_cast<int>(c.no_dy.size()) && c.no_dy[j]);
  };
  for (int j = 0; j < c.outputs; ++j)
    rs.push_back(wanted_dy(j) ? random_tensor(ys[j].shape, -1, 1, 100 + j) : rt::Tensor{});
  auto loss = [&](const std::vector<rt::Tensor>& inputs) {
    std::vector<rt::Tensor> out = run(fwd.model, inputs, backend);
    double l = 0;
    for (int j = 0; j < c.outputs; ++j)
      if (rs[j].dtype == DType::kFloat32)
        for (int64_t i = 0; i < out[j].numel(); ++i)
          l += static_cast<double>(out[j].as<float>()[i]) * rs[j].as<float>()[i];
    return l;
  };

  Gradient grad = gradient_model(c, fwd.model.graph().node(0), ys, rs);
  std::vector<rt::Tensor> dxs = run(grad.model, grad.inputs, backend);
  REQUIRE(dxs.size() == grad.checked.size());
  check_against_cpu(backend, grad.model, grad.inputs, dxs, c, "gradient");
  check_writes_every_output(backend, grad.model.graph().node(0), static_cast<size_t>(c.outputs),
                            grad.kernel_in, grad.kernel_out);
  check_zeroed_in_arena(grad, &backend == &rt::cpu_backend()
                                  ? dxs
                                  : run(grad.model, grad.inputs, rt::cpu_backend()));
  check_numeric(c, grad.checked, fwd.present, dxs, loss);
}

}  // namespace stagecraft::testing
