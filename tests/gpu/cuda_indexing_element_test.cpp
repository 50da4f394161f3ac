// The indexing family's per-element functions (runtime/ops/indexing_element.h), which the CPU
// backend and the CUDA kernels both run, checked on the host without a GPU on random shapes:
// the CPU backend's Tile, CumSum, GatherElements and ScatterND and their gradients against
// straightforward transcriptions of ONNX's definitions (loops over the elements, the updates
// applied one after another), and the one function only the CUDA backend runs,
// gather_elements_grad_element (a gather), against the CPU's scatter bit for bit.
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/indexing_shape.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt {
namespace {

int pick(std::mt19937& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

void set_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void set_string(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(value);
}

void run_cpu(std::string_view op, const Attrs& attrs, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out, DeviceContext& device) {
  cpu_backend().kernel(op)(KernelArgs{"case", op, attrs, in, out, device});
}

// The gradient node of `forward` with n forward inputs.
onnx::NodeProto grad_node(const onnx::NodeProto& forward, int64_t n) {
  onnx::NodeProto node = forward;
  set_int(node, std::string(grad::kForwardInputsAttr), n);
  return node;
}

Tensor random_floats(std::mt19937& rng, const Shape& shape) {
  Tensor t = Tensor::owned(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.as<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
  return t;
}

Tensor int64s(const Shape& shape, const std::vector<int64_t>& values) {
  Tensor t = Tensor::owned(DType::kInt64, shape);
  std::copy(values.begin(), values.end(), t.as<int64_t>());
  return t;
}

Shape random_shape(std::mt19937& rng, int min_rank, int max_rank, int max_dim) {
  Shape s;
  const int rank = pick(rng, min_rank, max_rank);
  for (int d = 0; d < rank; ++d) s.push_back(pick(rng, 1, max_dim));
  return s;
}

std::vector<int64_t> coordinates(int64_t e, const Shape& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = e % shape[d];
    e /= shape[d];
  }
  return c;
}

int64_t offset_of(const std::vector<int64_t>& c, const Shape& shape) {
  int64_t offset = 0;
  for (size_t d = 0; d < shape.size(); ++d) offset = offset * shape[d] + c[d];
  return offset;
}

TEST_CASE("indexing: Tile and TileGrad against their definitions") {
  std::mt19937 rng(21);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  const onnx::NodeProto node;
  const Attrs attrs(node);
  const onnx::NodeProto gnode = grad_node(node, 2);
  const Attrs gattrs(gnode);
  for (int trial = 0; trial < 150; ++trial) {
    const Tensor x = random_floats(rng, random_shape(rng, 0, 4, 4));
    std::vector<int64_t> r;
    Shape y_shape;
    for (int64_t d : x.shape) {
      r.push_back(pick(rng, 0, 6) == 0 ? 0 : pick(rng, 1, 3));
      y_shape.push_back(d * r.back());
    }
    const Tensor repeats = int64s({static_cast<int64_t>(r.size())}, r);
    CAPTURE(shape_string(x.shape));
    CAPTURE(shape_string(y_shape));
    Tensor y = Tensor::owned(DType::kFloat32, y_shape);
    run_cpu("Tile", attrs, {&x, &repeats}, {&y}, *device);
    const Tensor dy = random_floats(rng, y_shape);
    std::vector<double> want_dx(static_cast<size_t>(x.numel()), 0.0);
    for (int64_t e = 0; e < y.numel(); ++e) {
      std::vector<int64_t> c = coordinates(e, y_shape);
      for (size_t d = 0; d < c.size(); ++d) c[d] %= x.shape[d];
      const int64_t source = offset_of(c, x.shape);
      REQUIRE(y.as<float>()[e] == x.as<float>()[source]);
      want_dx[source] += dy.as<float>()[e];
    }
    Tensor dx = Tensor::owned(DType::kFloat32, x.shape);
    run_cpu("TileGrad", gattrs, {&x, &repeats, &y, &dy}, {&dx, nullptr}, *device);
    for (int64_t i = 0; i < x.numel(); ++i)
      REQUIRE(std::fabs(dx.as<float>()[i] - want_dx[i]) <= 1e-5);
  }
}

TEST_CASE("indexing: CumSum and CumSumGrad against their definitions") {
  std::mt19937 rng(22);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  for (int trial = 0; trial < 150; ++trial) {
    const Shape shape = random_shape(rng, 1, 4, 5);
    const auto rank = static_cast<int64_t>(shape.size());
    const int64_t axis = pick(rng, static_cast<int>(-rank), static_cast<int>(rank - 1));
    const bool exclusive = pick(rng, 0, 1) == 1, reverse = pick(rng, 0, 1) == 1;
    onnx::NodeProto node;
    set_int(node, "exclusive", exclusive);
    set_int(node, "reverse", reverse);
    const Attrs attrs(node);
    const Tensor axis_tensor = int64s({}, {axis});
    const int64_t a = axis < 0 ? axis + rank : axis;
    CAPTURE(shape_string(shape));
    CAPTURE(axis);
    CAPTURE(exclusive);
    CAPTURE(reverse);
    // The running sum at each element of a tensor of `shape`.
    auto definition = [&](auto value, bool backwards) {
      std::vector<double> out(static_cast<size_t>(shape_numel(shape)), 0.0);
      for (int64_t e = 0; e < shape_numel(shape); ++e) {
        std::vector<int64_t> c = coordinates(e, shape);
        const int64_t at = c[a];
        for (int64_t k = 0; k < shape[a]; ++k) {
          const bool in =
              backwards ? (exclusive ? k > at : k >= at) : (exclusive ? k < at : k <= at);
          if (!in) continue;
          c[a] = k;
          out[e] += value(offset_of(c, shape));
        }
      }
      return out;
    };
    const Tensor x = random_floats(rng, shape);
    Tensor y = Tensor::owned(DType::kFloat32, shape);
    run_cpu("CumSum", attrs, {&x, &axis_tensor}, {&y}, *device);
    const std::vector<double> want =
        definition([&](int64_t i) { return x.as<float>()[i]; }, reverse);
    for (int64_t e = 0; e < y.numel(); ++e) REQUIRE(std::fabs(y.as<float>()[e] - want[e]) <= 1e-5);
    // int64 with wrap-around: the sums of values near the top of the range.
    Tensor xi = Tensor::owned(DType::kInt64, shape);
    for (int64_t i = 0; i < xi.numel(); ++i)
      xi.as<int64_t>()[i] = pick(rng, 0, 1) ? INT64_MAX - pick(rng, 0, 3) : pick(rng, -9, 9);
    Tensor yi = Tensor::owned(DType::kInt64, shape);
    run_cpu("CumSum", attrs, {&xi, &axis_tensor}, {&yi}, *device);
    for (int64_t e = 0; e < yi.numel(); ++e) {
      std::vector<int64_t> c = coordinates(e, shape);
      const int64_t at = c[a];
      uint64_t sum = 0;
      for (int64_t k = 0; k < shape[a]; ++k) {
        const bool in = reverse ? (exclusive ? k > at : k >= at) : (exclusive ? k < at : k <= at);
        c[a] = k;
        if (in) sum += static_cast<uint64_t>(xi.as<int64_t>()[offset_of(c, shape)]);
      }
      REQUIRE(yi.as<int64_t>()[e] == static_cast<int64_t>(sum));
    }
    // The gradient: dX[i] sums dY over the outputs whose sum holds x[i].
    const onnx::NodeProto gnode = grad_node(node, 2);
    const Attrs gattrs(gnode);
    const Tensor dy = random_floats(rng, shape);
    Tensor dx = Tensor::owned(DType::kFloat32, shape);
    run_cpu("CumSumGrad", gattrs, {&x, &axis_tensor, &y, &dy}, {&dx, nullptr}, *device);
    const std::vector<double> want_dx =
        definition([&](int64_t i) { return dy.as<float>()[i]; }, !reverse);
    for (int64_t i = 0; i < dx.numel(); ++i)
      REQUIRE(std::fabs(dx.as<float>()[i] - want_dx[i]) <= 1e-5);
  }
}

TEST_CASE("indexing: GatherElements against its definition: the cuda gradient equals the cpu's") {
  std::mt19937 rng(23);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  int repeated = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Shape data_shape = random_shape(rng, 1, 4, 4);
    const auto rank = static_cast<int64_t>(data_shape.size());
    const int64_t axis = pick(rng, static_cast<int>(-rank), static_cast<int>(rank - 1));
    const int64_t a = axis < 0 ? axis + rank : axis;
    Shape index_shape;
    for (int64_t d = 0; d < rank; ++d)
      index_shape.push_back(d == a ? pick(rng, 1, 6)
                                   : pick(rng, 1, static_cast<int>(data_shape[d])));
    std::vector<int64_t> values;
    for (int64_t i = 0; i < shape_numel(index_shape); ++i)
      values.push_back(
          pick(rng, static_cast<int>(-data_shape[a]), static_cast<int>(data_shape[a] - 1)));
    const Tensor indices = int64s(index_shape, values);
    onnx::NodeProto node;
    set_int(node, "axis", axis);
    const Attrs attrs(node);
    CAPTURE(shape_string(data_shape));
    CAPTURE(shape_string(index_shape));
    CAPTURE(axis);
    const Tensor data = random_floats(rng, data_shape);
    Tensor y = Tensor::owned(DType::kFloat32, index_shape);
    run_cpu("GatherElements", attrs, {&data, &indices}, {&y}, *device);
    for (int64_t e = 0; e < y.numel(); ++e) {
      std::vector<int64_t> c = coordinates(e, index_shape);
      c[a] = values[e] < 0 ? values[e] + data_shape[a] : values[e];
      REQUIRE(y.as<float>()[e] == data.as<float>()[offset_of(c, data_shape)]);
    }
    const onnx::NodeProto gnode = grad_node(node, 2);
    const Attrs gattrs(gnode);
    const Tensor dy = random_floats(rng, index_shape);
    Tensor dx = Tensor::owned(DType::kFloat32, data_shape);
    run_cpu("GatherElementsGrad", gattrs, {&data, &indices, &y, &dy}, {&dx, nullptr}, *device);
    const ops::GatherElementsPlan plan = ops::gather_elements_plan(
        KernelArgs{"case", "GatherElements", attrs, {}, {}, *device}, data_shape, indices);
    for (int64_t p = 0; p < dx.numel(); ++p) {
      const float got =
          ops::gather_elements_grad_element(plan.shape, plan.indices.data(), dy.as<float>(), p);
      REQUIRE(std::memcmp(&got, dx.as<float>() + p, sizeof got) == 0);
    }
    repeated += y.numel() > data.numel() ? 1 : 0;
  }
  CHECK(repeated >= 20);
}

TEST_CASE("indexing: ScatterND against ONNX's sequential definition, with repeated slots") {
  std::mt19937 rng(24);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  int repeats = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Shape data_shape = random_shape(rng, 1, 4, 4);
    const auto rank = static_cast<int64_t>(data_shape.size());
    const int64_t k = pick(rng, 1, static_cast<int>(rank));
    Shape index_shape = random_shape(rng, 0, 2, 4);
    const int64_t count = shape_numel(index_shape);
    index_shape.push_back(k);
    Shape update_shape(index_shape.begin(), index_shape.end() - 1);
    update_shape.insert(update_shape.end(), data_shape.begin() + k, data_shape.end());
    std::vector<int64_t> values;
    for (int64_t u = 0; u < count; ++u)
      for (int64_t t = 0; t < k; ++t)
        values.push_back(
            pick(rng, static_cast<int>(-data_shape[t]), static_cast<int>(data_shape[t] - 1)));
    const Tensor indices = int64s(index_shape, values);
    const char* reductions[] = {"none", "add", "mul"};
    const std::string reduction = reductions[pick(rng, 0, 2)];
    onnx::NodeProto node;
    set_string(node, "reduction", reduction);
    const Attrs attrs(node);
    CAPTURE(shape_string(data_shape));
    CAPTURE(shape_string(index_shape));
    CAPTURE(reduction);
    const Tensor data = random_floats(rng, data_shape);
    const Tensor updates = random_floats(rng, update_shape);
    Tensor y = Tensor::owned(DType::kFloat32, data_shape);
    run_cpu("ScatterND", attrs, {&data, &indices, &updates}, {&y}, *device);
    // ONNX's reference: a copy of the data, each update applied in order.
    std::vector<float> want(data.as<float>(), data.as<float>() + data.numel());
    const int64_t slice = shape_numel(Shape(data_shape.begin() + k, data_shape.end()));
    std::vector<int64_t> slot_of(static_cast<size_t>(count));
    std::vector<int> hits(
        static_cast<size_t>(shape_numel(data_shape) / std::max<int64_t>(slice, 1) + 1), 0);
    for (int64_t u = 0; u < count; ++u) {
      int64_t slot = 0;
      for (int64_t t = 0; t < k; ++t) {
        const int64_t index = values[u * k + t];
        slot = slot * data_shape[t] + (index < 0 ? index + data_shape[t] : index);
      }
      slot_of[u] = slot;
      repeats += hits[slot]++ > 0 ? 1 : 0;
      for (int64_t j = 0; j < slice; ++j) {
        float& v = want[slot * slice + j];
        const float w = updates.as<float>()[u * slice + j];
        v = reduction == "add" ? v + w : reduction == "mul" ? v * w : w;
      }
    }
    for (int64_t e = 0; e < y.numel(); ++e) REQUIRE(y.as<float>()[e] == want[e]);
    if (reduction == "mul") continue;
    // Gradients: dData is dY where nothing replaced it; dUpdates is dY at the winner's slot.
    const onnx::NodeProto gnode = grad_node(node, 3);
    const Attrs gattrs(gnode);
    const Tensor dy = random_floats(rng, data_shape);
    Tensor d_data = Tensor::owned(DType::kFloat32, data_shape);
    Tensor d_updates = Tensor::owned(DType::kFloat32, update_shape);
    run_cpu("ScatterNDGrad", gattrs, {&data, &indices, &updates, &y, &dy},
            {&d_data, nullptr, &d_updates}, *device);
    for (int64_t e = 0; e < d_data.numel(); ++e) {
      const bool replaced = reduction == "none" && hits[e / slice] > 0;
      REQUIRE(d_data.as<float>()[e] == (replaced ? 0.0f : dy.as<float>()[e]));
    }
    for (int64_t u = 0; u < count; ++u) {
      bool wins = true;
      for (int64_t later = u + 1; later < count; ++later)
        wins = wins && slot_of[later] != slot_of[u];
      for (int64_t j = 0; j < slice; ++j) {
        const float expected =
            reduction == "add" || wins ? dy.as<float>()[slot_of[u] * slice + j] : 0.0f;
        REQUIRE(d_updates.as<float>()[u * slice + j] == expected);
      }
    }
  }
  CHECK(repeats >= 30);
}

TEST_CASE("indexing: one-line refusals naming the node and the numbers") {
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  onnx::NodeProto node;
  set_int(node, "axis", 1);
  const Attrs attrs(node);
  auto message = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const KernelArgs tile{"t", "Tile", attrs, {}, {}, *device};
  CHECK(message([&] {
          ops::tile_shape(tile, {2, 3}, int64s({1}, {2}));
        }) == "Tile 't': 1 repeats for a rank-2 input [2, 3]");
  CHECK(message([&] {
          ops::tile_shape(tile, {2, 3}, int64s({2}, {2, -1}));
        }) == "Tile 't': repeat -1 of dim 1 is negative");
  const KernelArgs gather{"g", "GatherElements", attrs, {}, {}, *device};
  CHECK(message([&] {
          ops::gather_elements_plan(gather, {2, 3}, int64s({2, 1}, {0, 3}));
        }) == "GatherElements 'g': index 3 is out of range for axis 1 of size 3");
  CHECK(message([&] {
          ops::gather_elements_plan(gather, {2, 3}, int64s({3, 1}, {0, 1, 2}));
        }) ==
        "GatherElements 'g': indices [3, 1] are larger than data [2, 3] in dim 0 (off the axis 1)");
  const KernelArgs scatter{"s", "ScatterND", attrs, {}, {}, *device};
  CHECK(message([&] {
          ops::scatter_plan(scatter, {4, 2}, int64s({1, 1}, {4}), {1, 2});
        }) == "ScatterND 's': index 4 (update 0, element 0) is out of range for dim 0 of size 4");
  CHECK(message([&] {
          ops::scatter_plan(scatter, {4, 2}, int64s({1, 1}, {1}), {2, 2});
        }) == "ScatterND 's': updates are [2, 2], expected [1, 2] (indices [1, 1], data [4, 2])");
  const KernelArgs cumsum{"c", "CumSum", attrs, {}, {}, *device};
  CHECK(message([&] {
          ops::scan_shape(cumsum, {2, 3}, int64s({}, {2}));
        }) == "CumSum 'c': axis 2 is out of range for rank 2");
}

}  // namespace
}  // namespace stagecraft::rt
