// The per-element functions of the CUDA Pad and reduction kernels (runtime/cuda/pad_element.h,
// reduce_element.h), run on the host without a GPU, against the CPU backend's kernels on random
// shapes: Pad in constant, reflect and edge mode with negative pads and reflections past the
// dim (pads and constant as inputs or as the attributes of old opsets), PadGrad, and every
// reduction forward (float32, float64, int32, int64) and backward (float32) over random axes
// with keepdims and noop_with_empty_axes, with ties, zeros, infinities and NaNs in X. The host
// builds the tables and loops exactly as the CUDA backend does (the CPU's shared pad_shape.h and
// reduce_shape.h), and the results must equal the CPU's bit for bit: the functions fold in the
// CPU's order. (The one-block-per-output forward kernel changes only the order of double sums.)
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cuda/pad_element.h"
#include "runtime/cuda/reduce_element.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/pad_shape.h"
#include "runtime/ops/reduce_shape.h"

namespace stagecraft::rt {
namespace {

void set_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void set_ints(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

int pick(std::mt19937& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

Tensor int64_tensor(const std::vector<int64_t>& values) {
  Tensor t = Tensor::owned(DType::kInt64, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(t.data, values.data(), values.size() * sizeof(int64_t));
  return t;
}

// Runs the CPU backend's kernel for `op`.
void run_cpu(std::string_view op, const Attrs& attrs, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out, DeviceContext& device) {
  const KernelArgs args{"case", op, attrs, in, out, device};
  cpu_backend().kernel(op)(args);
}

// Equal bit for bit, or both NaN.
template <class T>
bool same(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

struct PadCase {
  Shape x_shape;
  std::vector<int64_t> pads;
  onnx::NodeProto node;
  bool pads_as_input = true;
  bool constant_as_input = false;
  float constant = 0.0f;
};

PadCase random_pad_case(std::mt19937& rng) {
  PadCase c;
  const int rank = pick(rng, 0, 4);
  for (int d = 0; d < rank; ++d) c.x_shape.push_back(pick(rng, 0, 9) == 0 ? 0 : pick(rng, 1, 4));
  // Pads from cropping to reflecting more than twice past the dim.
  for (int k = 0; k < 2 * rank; ++k) c.pads.push_back(pick(rng, 0, 2) == 0 ? pick(rng, -3, 9) : 0);
  const char* modes[] = {"constant", "reflect", "edge"};
  onnx::AttributeProto* mode = c.node.add_attribute();
  mode->set_name("mode");
  mode->set_type(onnx::AttributeProto::STRING);
  mode->set_s(modes[pick(rng, 0, 2)]);
  c.constant = static_cast<float>(pick(rng, -5, 5)) / 2;
  c.pads_as_input = pick(rng, 0, 1) == 1;
  if (!c.pads_as_input) {  // opsets 2-10: pads and value as attributes
    set_ints(c.node, "pads", c.pads);
    onnx::AttributeProto* value = c.node.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::FLOAT);
    value->set_f(c.constant);
  } else {
    c.constant_as_input = pick(rng, 0, 1) == 1;
  }
  return c;
}

TEST_CASE("the cuda pad kernels' elements equal the cpu's Pad and PadGrad on random shapes") {
  std::mt19937 rng(15);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  int checked = 0, reflected = 0;
  for (int trial = 0; trial < 600; ++trial) {
    PadCase c = random_pad_case(rng);
    const Attrs attrs(c.node);
    Tensor x = Tensor::owned(DType::kFloat32, c.x_shape);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.as<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
    const Tensor pads = int64_tensor(c.pads);
    Tensor constant = Tensor::owned(DType::kFloat32, {});
    constant.as<float>()[0] = c.constant;
    std::vector<const Tensor*> in{&x};
    if (c.pads_as_input) in.push_back(&pads);
    if (c.constant_as_input) in.push_back(&constant);
    ops::PadGeometry g;
    try {
      g = ops::pad_geometry(KernelArgs{"case", "Pad", attrs, in, {}, *device}, x.shape,
                            c.pads_as_input ? &pads : nullptr);
    } catch (const Error&) {
      continue;  // cropped below zero, or an empty dim reflected
    }
    CAPTURE(c.node.DebugString());
    CAPTURE(shape_string(c.x_shape));
    Tensor y = Tensor::owned(DType::kFloat32, g.y_shape);
    run_cpu("Pad", attrs, in, {&y}, *device);
    const cuda::PadTableData data = cuda::pad_tables(x.shape, g.y_shape, g.source);
    const cuda::PadTables tables = data.at(data.values.data());
    const KernelArgs args{"case", "Pad", attrs, in, {}, *device};
    const std::vector<std::byte> value =
        ops::pad_constant(args, x, c.constant_as_input ? &constant : nullptr);
    float fill;
    std::memcpy(&fill, value.data(), sizeof(fill));
    for (int64_t e = 0; e < y.numel(); ++e)
      REQUIRE(same(cuda::pad_element(tables, x.as<float>(), fill, e), y.as<float>()[e]));

    // The gradient: n forward inputs (X, and pads where it is an input), Y, dY -> dX.
    onnx::NodeProto grad_node = c.node;
    const int64_t n = c.pads_as_input ? 2 : 1;
    set_int(grad_node, std::string(grad::kForwardInputsAttr), n);
    const Attrs grad_attrs(grad_node);
    Tensor dy = Tensor::owned(DType::kFloat32, g.y_shape);
    for (int64_t e = 0; e < dy.numel(); ++e)
      dy.as<float>()[e] = std::uniform_real_distribution<float>(-1, 1)(rng);
    Tensor dx = Tensor::owned(DType::kFloat32, x.shape);
    std::vector<const Tensor*> grad_in{&x};
    std::vector<Tensor*> grad_out{&dx};
    if (n == 2) {
      grad_in.push_back(&pads);
      grad_out.push_back(nullptr);
    }
    grad_in.push_back(&y);
    grad_in.push_back(&dy);
    run_cpu("PadGrad", grad_attrs, grad_in, grad_out, *device);
    for (int64_t i = 0; i < x.numel(); ++i)
      REQUIRE(same(cuda::pad_grad_element(tables, dy.as<float>(), i), dx.as<float>()[i]));
    reflected += c.node.attribute(0).s() != "constant" && y.numel() > x.numel() ? 1 : 0;
    ++checked;
  }
  CHECK(checked >= 300);
  CHECK(reflected >= 50);
}

TEST_CASE("the cuda pad tables on int8 and int64 elements move the same bytes as the cpu's Pad") {
  std::mt19937 rng(16);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  onnx::NodeProto node;
  onnx::AttributeProto* mode = node.add_attribute();
  mode->set_name("mode");
  mode->set_type(onnx::AttributeProto::STRING);
  mode->set_s("reflect");
  const Attrs attrs(node);
  const Tensor pads = int64_tensor({1, -1, 5, 2, 0, 7});
  for (DType dtype : {DType::kInt8, DType::kInt64}) {
    CAPTURE(dtype_name(dtype));
    Tensor x = Tensor::owned(dtype, {3, 2, 4});
    for (int64_t i = 0; i < x.bytes(); ++i) x.data[i] = static_cast<std::byte>(pick(rng, 0, 255));
    const std::vector<const Tensor*> in{&x, &pads};
    const ops::PadGeometry g =
        ops::pad_geometry(KernelArgs{"case", "Pad", attrs, in, {}, *device}, x.shape, &pads);
    Tensor y = Tensor::owned(dtype, g.y_shape);
    run_cpu("Pad", attrs, in, {&y}, *device);
    const cuda::PadTableData data = cuda::pad_tables(x.shape, g.y_shape, g.source);
    const cuda::PadTables tables = data.at(data.values.data());
    for (int64_t e = 0; e < y.numel(); ++e) {
      if (dtype == DType::kInt8)
        REQUIRE(cuda::pad_element(tables, x.as<uint8_t>(), uint8_t{0}, e) == y.as<uint8_t>()[e]);
      else
        REQUIRE(cuda::pad_element(tables, x.as<uint64_t>(), uint64_t{0}, e) == y.as<uint64_t>()[e]);
    }
  }
}

// Each reduction with the kind its CUDA kernels run (reduce.cpp maps them alike).
struct NamedReduction {
  const char* op;
  cuda::Reduction kind;
};
constexpr NamedReduction kReductions[] = {
    {"ReduceSum", cuda::Reduction::kSum},
    {"ReduceMax", cuda::Reduction::kMax},
    {"ReduceMin", cuda::Reduction::kMin},
    {"ReduceProd", cuda::Reduction::kProd},
    {"ReduceL1", cuda::Reduction::kL1},
    {"ReduceL2", cuda::Reduction::kL2},
    {"ReduceSumSquare", cuda::Reduction::kSumSquare},
    {"ReduceLogSum", cuda::Reduction::kLogSum},
    {"ReduceLogSumExp", cuda::Reduction::kLogSumExp},
};

struct ReduceCase {
  Shape x_shape;
  std::vector<int64_t> axes;
  onnx::NodeProto node;
  bool axes_as_input = false;
};

ReduceCase random_reduce_case(std::mt19937& rng) {
  ReduceCase c;
  const int rank = pick(rng, 0, 5);
  for (int d = 0; d < rank; ++d) c.x_shape.push_back(pick(rng, 0, 15) == 0 ? 0 : pick(rng, 1, 4));
  for (int d = 0; d < rank; ++d)
    if (pick(rng, 0, 1) == 1) c.axes.push_back(pick(rng, 0, 1) == 1 ? d : d - rank);
  std::shuffle(c.axes.begin(), c.axes.end(), rng);
  c.axes_as_input = pick(rng, 0, 1) == 1;
  if (!c.axes_as_input && !c.axes.empty()) set_ints(c.node, "axes", c.axes);
  if (pick(rng, 0, 2) > 0) set_int(c.node, "keepdims", pick(rng, 0, 1));
  if (c.axes.empty() && pick(rng, 0, 1) == 1) set_int(c.node, "noop_with_empty_axes", 1);
  return c;
}

// Values with ties and zeros (small integers, halved), now and then a NaN or an infinity.
template <class T>
void fill(Tensor& x, std::mt19937& rng, bool odd_values) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    T v = static_cast<T>(pick(rng, -3, 3));
    if constexpr (std::is_floating_point_v<T>) {
      v /= 2;
      const int odd = odd_values ? pick(rng, 0, 40) : -1;
      if (odd == 0) v = std::numeric_limits<T>::quiet_NaN();
      if (odd == 1) v = std::numeric_limits<T>::infinity() * (pick(rng, 0, 1) == 1 ? 1 : -1);
    }
    x.as<T>()[i] = v;
  }
}

// The CPU's forward of `op` on X of `dtype` against cuda::reduce_output for every output.
template <class T>
void check_forward(const NamedReduction& r, const ReduceCase& c, DType dtype, std::mt19937& rng,
                   DeviceContext& device) {
  const std::string_view op = r.op;
  const Attrs attrs(c.node);
  Tensor x = Tensor::owned(dtype, c.x_shape);
  fill<T>(x, rng, true);
  const Tensor axes = int64_tensor(c.axes);
  std::vector<const Tensor*> in{&x};
  if (c.axes_as_input) in.push_back(&axes);
  const KernelArgs args{"case", op, attrs, in, {}, device};
  const ops::ReducedDims dims = ops::reduced_dims(args, x.shape, c.axes_as_input ? &axes : nullptr);
  Tensor y = Tensor::owned(dtype, dims.y_shape);
  run_cpu(op, attrs, in, {&y}, device);
  if (y.numel() == 0) return;
  cuda::ReduceGroups s;
  REQUIRE(cuda::reduce_groups(ops::reduction_groups(x.shape, dims.reduced), s));
  REQUIRE(s.outputs == y.numel());
  for (int64_t o = 0; o < y.numel(); ++o)
    REQUIRE(same(cuda::reduce_output(r.kind, s, x.as<T>(), o), y.as<T>()[o]));
}

TEST_CASE("the cuda reductions' elements equal the cpu's reductions and gradients") {
  std::mt19937 rng(17);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  int forward = 0, backward = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const ReduceCase c = random_reduce_case(rng);
    CAPTURE(c.node.DebugString());
    CAPTURE(shape_string(c.x_shape));
    CAPTURE(c.axes_as_input);
    for (const NamedReduction& r : kReductions) {
      const std::string_view op = r.op;
      CAPTURE(op);
      const bool floats_only = op == "ReduceL2" || op.starts_with("ReduceLogSum");
      check_forward<float>(r, c, DType::kFloat32, rng, *device);
      check_forward<double>(r, c, DType::kFloat64, rng, *device);
      if (!floats_only) {
        check_forward<int32_t>(r, c, DType::kInt32, rng, *device);
        check_forward<int64_t>(r, c, DType::kInt64, rng, *device);
      }
      forward += 1;

      // The gradient: X (and axes where they are an input), Y, dY -> dX.
      onnx::NodeProto grad_node = c.node;
      const int64_t n = c.axes_as_input ? 2 : 1;
      set_int(grad_node, std::string(grad::kForwardInputsAttr), n);
      const Attrs attrs(c.node), grad_attrs(grad_node);
      Tensor x = Tensor::owned(DType::kFloat32, c.x_shape);
      fill<float>(x, rng, true);
      const Tensor axes = int64_tensor(c.axes);
      std::vector<const Tensor*> in{&x};
      if (c.axes_as_input) in.push_back(&axes);
      const ops::ReducedDims dims =
          ops::reduced_dims(KernelArgs{"case", op, attrs, in, {}, *device}, x.shape,
                            c.axes_as_input ? &axes : nullptr);
      Tensor y = Tensor::owned(DType::kFloat32, dims.y_shape);
      run_cpu(op, attrs, in, {&y}, *device);
      Tensor dy = Tensor::owned(DType::kFloat32, dims.y_shape);
      for (int64_t o = 0; o < dy.numel(); ++o)
        dy.as<float>()[o] = std::uniform_real_distribution<float>(-1, 1)(rng);
      Tensor dx = Tensor::owned(DType::kFloat32, c.x_shape);
      std::vector<const Tensor*> grad_in = in;
      grad_in.push_back(&y);
      grad_in.push_back(&dy);
      std::vector<Tensor*> grad_out{&dx};
      if (n == 2) grad_out.push_back(nullptr);
      run_cpu(std::string(op) + "Grad", grad_attrs, grad_in, grad_out, *device);
      if (x.numel() == 0) continue;
      cuda::ReduceGroups s;
      REQUIRE(cuda::reduce_groups(ops::reduction_groups(x.shape, dims.reduced), s));
      const cuda::Reduction kind = r.kind;
      std::vector<float> mine(static_cast<size_t>(x.numel()), -7.0f);
      if (kind == cuda::Reduction::kProd) {
        for (int64_t o = 0; o < s.outputs; ++o)
          cuda::reduce_prod_grad_output(s, x.as<float>(), dy.as<float>()[o], mine.data(), o);
      } else {
        std::vector<float> share(static_cast<size_t>(s.outputs));
        for (int64_t o = 0; o < s.outputs; ++o)
          share[o] =
              cuda::reduce_tie_share(s, x.as<float>(), y.as<float>()[o], dy.as<float>()[o], o);
        for (int64_t i = 0; i < x.numel(); ++i) {
          const int64_t o = cuda::reduce_output_of(s, i);
          mine[i] = cuda::reduce_grad_element(kind, x.as<float>()[i], y.as<float>()[o],
                                              dy.as<float>()[o], share[o]);
        }
      }
      for (int64_t i = 0; i < x.numel(); ++i) REQUIRE(same(mine[i], dx.as<float>()[i]));
      backward += 1;
    }
  }
  CHECK(forward == 300 * 9);
  CHECK(backward >= 200 * 9);
}

}  // namespace
}  // namespace stagecraft::rt
