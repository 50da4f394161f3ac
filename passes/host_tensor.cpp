#include "passes/host_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compiler/ir/onnx_bridge.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {
namespace {

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  return ir::checked_numel(shape, "folded tensor");
}

HostTensor make(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t n = numel_of(t.shape);
  if (t.is_real()) {
    t.reals.assign(n, 0.0);
  } else {
    t.ints.assign(n, 0);
  }
  return t;
}

void set(HostTensor& t, int64_t i, int64_t iv, double rv) {
  if (t.is_real()) {
    t.reals[i] = rv;
  } else {
    t.ints[i] = iv;
  }
}

/// Copies element `src_i` of `src` into element `dst_i` of `dst` (same dtype).
void copy_elem(const HostTensor& src, int64_t src_i, HostTensor& dst, int64_t dst_i) {
  if (src.is_real()) {
    dst.reals[dst_i] = src.reals[src_i];
  } else {
    dst.ints[dst_i] = src.ints[src_i];
  }
}

int64_t normalize_axis(int64_t axis, int64_t rank, const ir::Node& node) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max<int64_t>(rank, 1)) {
    fail(ErrorKind::kModel, "node '{}' ({}): axis {} is out of range for rank {}", node.name,
         node.op_type, axis, rank);
  }
  return a;
}

std::vector<int64_t> as_ints(const HostTensor& t) {
  std::vector<int64_t> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.int_at(i);
  return v;
}

std::vector<int64_t> broadcast_shape(const std::vector<std::vector<int64_t>>& shapes,
                                     const ir::Node& node) {
  std::size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    for (std::size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      int64_t d = s[i];
      if (o == 1) {
        o = d;
      } else if (d != 1 && d != o) {
        fail(ErrorKind::kModel, "node '{}' ({}): shapes {} do not broadcast", node.name,
             node.op_type, ir::shape_string(s));
      }
    }
  }
  return out;
}

/// Index into `t` of the element that broadcasts to flat index `flat` of `out_shape`.
int64_t broadcast_index(const HostTensor& t, const std::vector<int64_t>& out_shape, int64_t flat) {
  int64_t idx = 0;
  int64_t stride = 1;
  auto rank = static_cast<int64_t>(out_shape.size());
  auto trank = static_cast<int64_t>(t.shape.size());
  for (int64_t i = rank - 1; i >= 0; --i) {
    int64_t coord = flat % out_shape[i];
    flat /= out_shape[i];
    int64_t ti = i - (rank - trank);
    if (ti >= 0) {
      int64_t d = t.shape[ti];
      idx += (d == 1 ? 0 : coord) * stride;
      stride *= d;
    }
  }
  return idx;
}

std::optional<HostTensor> binary(const ir::Node& node, const HostTensor& a, const HostTensor& b) {
  if (a.dtype != b.dtype) return std::nullopt;
  auto shape = broadcast_shape({a.shape, b.shape}, node);
  const std::string& op = node.op_type;
  HostTensor out = make(op == "Equal" ? DType::kBool : a.dtype, shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t ia = broadcast_index(a, shape, i);
    int64_t ib = broadcast_index(b, shape, i);
    if (a.is_real()) {
      double x = a.reals[ia], y = b.reals[ib];
      double r = op == "Add" ? x + y : op == "Sub" ? x - y : op == "Mul" ? x * y : op == "Div" ? x / y : 0;
      if (op == "Equal") {
        out.ints[i] = x == y;
      } else {
        out.reals[i] = a.dtype == DType::kFloat32 ? static_cast<float>(r) : r;
      }
    } else {
      int64_t x = a.ints[ia], y = b.ints[ib];
      if (op == "Div" && y == 0) {
        fail(ErrorKind::kModel, "node '{}' (Div): integer division by zero", node.name);
      }
      int64_t r = op == "Add" ? x + y : op == "Sub" ? x - y : op == "Mul" ? x * y : op == "Div" ? x / y : x == y;
      out.ints[i] = r;
    }
  }
  return out;
}

HostTensor gather(const ir::Node& node, const HostTensor& data, const HostTensor& indices) {
  int64_t rank = static_cast<int64_t>(data.shape.size());
  int64_t axis = normalize_axis(node.attr_int("axis", 0), rank, node);
  std::vector<int64_t> out_shape(data.shape.begin(), data.shape.begin() + axis);
  out_shape.insert(out_shape.end(), indices.shape.begin(), indices.shape.end());
  out_shape.insert(out_shape.end(), data.shape.begin() + axis + 1, data.shape.end());
  HostTensor out = make(data.dtype, out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= data.shape[i];
  for (int64_t i = axis + 1; i < rank; ++i) inner *= data.shape[i];
  int64_t dim = data.shape[axis];
  int64_t n_idx = indices.numel();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < n_idx; ++k) {
      int64_t idx = indices.int_at(k);
      if (idx < -dim || idx >= dim) {
        fail(ErrorKind::kModel, "node '{}' (Gather): index {} is out of range for dim {}", node.name,
             idx, dim);
      }
      if (idx < 0) idx += dim;
      for (int64_t in = 0; in < inner; ++in) {
        copy_elem(data, (o * dim + idx) * inner + in, out, (o * n_idx + k) * inner + in);
      }
    }
  }
  return out;
}

HostTensor slice(const ir::Node& node, const HostTensor& data, std::vector<int64_t> starts,
                 std::vector<int64_t> ends, std::vector<int64_t> axes, std::vector<int64_t> steps) {
  auto rank = static_cast<int64_t>(data.shape.size());
  if (axes.empty()) {
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
    fail(ErrorKind::kModel, "node '{}' (Slice): starts, ends, axes and steps differ in length", node.name);
  }
  std::vector<int64_t> start(rank, 0), step(rank, 1), out_shape = data.shape;
  for (std::size_t k = 0; k < starts.size(); ++k) {
    int64_t a = normalize_axis(axes[k], rank, node);
    int64_t dim = data.shape[a];
    int64_t st = steps[k];
    if (st == 0) fail(ErrorKind::kModel, "node '{}' (Slice): step is 0", node.name);
    int64_t s = starts[k], e = ends[k];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      out_shape[a] = e > s ? (e - s + st - 1) / st : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      out_shape[a] = s > e ? (s - e - st - 1) / (-st) : 0;
    }
    start[a] = s;
    step[a] = st;
  }
  HostTensor out = make(data.dtype, out_shape);
  auto in_strides = strides_of(data.shape);
  for (int64_t i = 0; i < out.numel(); ++i) {
    int64_t rem = i, src = 0;
    for (int64_t d = rank - 1; d >= 0; --d) {
      int64_t c = rem % out_shape[d];
      rem /= out_shape[d];
      src += (start[d] + c * step[d]) * in_strides[d];
    }
    copy_elem(data, src, out, i);
  }
  return out;
}

HostTensor expand(const ir::Node& node, const HostTensor& data, const std::vector<int64_t>& shape) {
  auto out_shape = broadcast_shape({data.shape, shape}, node);
  HostTensor out = make(data.dtype, out_shape);
  for (int64_t i = 0; i < out.numel(); ++i) copy_elem(data, broadcast_index(data, out_shape, i), out, i);
  return out;
}

HostTensor cast(const HostTensor& in, DType to) {
  HostTensor out = make(to, in.shape);
  for (int64_t i = 0; i < in.numel(); ++i) {
    if (out.is_real()) {
      double v = in.real_at(i);
      out.reals[i] = to == DType::kFloat32 ? static_cast<float>(v) : v;
    } else if (to == DType::kBool) {
      out.ints[i] = in.is_real() ? in.reals[i] != 0.0 : in.ints[i] != 0;
    } else {
      int64_t v = in.is_real() ? static_cast<int64_t>(in.reals[i]) : in.ints[i];
      out.ints[i] = to == DType::kInt32 ? static_cast<int32_t>(v) : v;
    }
  }
  return out;
}

std::optional<HostTensor> tensor_attribute(const onnx::TensorProto& proto) {
  ir::Value v;
  auto dtype = dtype_from_onnx(proto.data_type());
  if (!dtype || !host_dtype(*dtype)) return std::nullopt;
  v.dtype = *dtype;
  v.shape.assign(proto.dims().begin(), proto.dims().end());
  v.shape_known = true;
  onnx::TensorProto copy = proto;
  v.initializer = ir::take_tensor_data(copy, "");
  return HostTensor::from_value(v);
}

}  // namespace

bool host_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool:
      return true;
    default:
      return false;
  }
}

int64_t HostTensor::numel() const { return static_cast<int64_t>(is_real() ? reals.size() : ints.size()); }

int64_t HostTensor::int_at(int64_t i) const {
  return is_real() ? static_cast<int64_t>(reals[i]) : ints[i];
}

double HostTensor::real_at(int64_t i) const {
  return is_real() ? reals[i] : static_cast<double>(ints[i]);
}

std::optional<HostTensor> HostTensor::from_value(const ir::Value& value) {
  if (!value.initializer || !host_dtype(value.dtype) || !value.shape_known) return std::nullopt;
  HostTensor t = make(value.dtype, value.shape);
  auto bytes = value.initializer->bytes();
  int64_t n = t.numel();
  if (static_cast<int64_t>(bytes.size()) != n * dtype_size(value.dtype)) return std::nullopt;
  const std::byte* p = bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (value.dtype) {
      case DType::kFloat32: {
        float f;
        std::memcpy(&f, p + i * 4, 4);
        t.reals[i] = f;
        break;
      }
      case DType::kFloat64: std::memcpy(&t.reals[i], p + i * 8, 8); break;
      case DType::kInt32: {
        int32_t v;
        std::memcpy(&v, p + i * 4, 4);
        t.ints[i] = v;
        break;
      }
      case DType::kInt64: std::memcpy(&t.ints[i], p + i * 8, 8); break;
      case DType::kBool: t.ints[i] = static_cast<int64_t>(p[i] != std::byte{0}); break;
      default: return std::nullopt;
    }
  }
  return t;
}

std::string HostTensor::to_bytes() const {
  int64_t n = numel();
  std::string out(static_cast<std::size_t>(n * dtype_size(dtype)), '\0');
  char* p = out.data();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat32: {
        auto f = static_cast<float>(reals[i]);
        std::memcpy(p + i * 4, &f, 4);
        break;
      }
      case DType::kFloat64: std::memcpy(p + i * 8, &reals[i], 8); break;
      case DType::kInt32: {
        auto v = static_cast<int32_t>(ints[i]);
        std::memcpy(p + i * 4, &v, 4);
        break;
      }
      case DType::kInt64: std::memcpy(p + i * 8, &ints[i], 8); break;
      case DType::kBool: p[i] = static_cast<char>(ints[i] != 0); break;
      default: break;
    }
  }
  return out;
}

std::optional<std::vector<HostTensor>> evaluate_on_host(
    const ir::Node& node, const std::vector<std::optional<HostTensor>>& in,
    const std::vector<int64_t>& shape_input, int64_t opset) {
  const std::string& op = node.op_type;
  auto input = [&](std::size_t i) -> const HostTensor* {
    return i < in.size() && in[i] ? &*in[i] : nullptr;
  };
  auto one = [](HostTensor t) { return std::vector<HostTensor>{std::move(t)}; };

  if (op == "Shape") {
    auto rank = static_cast<int64_t>(shape_input.size());
    int64_t start = node.attr_int("start", 0), end = node.attr_int("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    HostTensor t = make(DType::kInt64, {end - start});
    for (int64_t i = start; i < end; ++i) t.ints[i - start] = shape_input[i];
    return one(t);
  }
  // Every other op needs its (non-optional) inputs constant.
  if (!input(0)) return std::nullopt;
  const HostTensor& x = *input(0);
  if (op == "Identity") return one(x);
  if (op == "ConstantOfShape") {
    HostTensor value = make(DType::kFloat32, {1});
    if (const auto* a = node.attribute("value")) {
      auto v = tensor_attribute(a->t());
      if (!v || v->numel() != 1) return std::nullopt;
      value = *v;
    }
    auto shape = as_ints(x);
    HostTensor t = make(value.dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) copy_elem(value, 0, t, i);
    return one(t);
  }
  if (op == "Range") {
    if (!input(1) || !input(2)) return std::nullopt;
    double start = x.real_at(0), limit = input(1)->real_at(0), delta = input(2)->real_at(0);
    if (delta == 0) fail(ErrorKind::kModel, "node '{}' (Range): delta is 0", node.name);
    auto n = static_cast<int64_t>(std::max(0.0, std::ceil((limit - start) / delta)));
    if (n > (1 << 24)) return std::nullopt;
    HostTensor t = make(x.dtype, {n});
    for (int64_t i = 0; i < n; ++i) set(t, i, x.int_at(0) + i * input(2)->int_at(0), start + i * delta);
    return one(t);
  }
  if (op == "Gather") {
    if (!input(1)) return std::nullopt;
    return one(gather(node, x, *input(1)));
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    std::vector<int64_t> axes = opset >= 13 ? (input(1) ? as_ints(*input(1)) : std::vector<int64_t>{})
                                            : node.attr_ints("axes");
    if (opset >= 13 && node.inputs.size() > 1 && node.inputs[1] != ir::kNoId && !input(1)) {
      return std::nullopt;
    }
    HostTensor t = x;
    if (op == "Unsqueeze") {
      auto rank = static_cast<int64_t>(x.shape.size() + axes.size());
      for (auto& a : axes) a = normalize_axis(a, rank, node);
      std::sort(axes.begin(), axes.end());
      for (int64_t a : axes) t.shape.insert(t.shape.begin() + a, 1);
    } else {
      auto rank = static_cast<int64_t>(x.shape.size());
      std::vector<bool> drop(rank, false);
      if (axes.empty()) {
        for (int64_t i = 0; i < rank; ++i) drop[i] = x.shape[i] == 1;
      }
      for (int64_t a : axes) {
        a = normalize_axis(a, rank, node);
        if (x.shape[a] != 1) {
          fail(ErrorKind::kModel, "node '{}' (Squeeze): dim {} has size {}, not 1", node.name, a, x.shape[a]);
        }
        drop[a] = true;
      }
      t.shape.clear();
      for (int64_t i = 0; i < rank; ++i) {
        if (!drop[i]) t.shape.push_back(x.shape[i]);
      }
    }
    return one(t);
  }
  if (op == "Concat") {
    auto rank = static_cast<int64_t>(x.shape.size());
    int64_t axis = normalize_axis(node.attr_int("axis", 0), rank, node);
    std::vector<int64_t> out_shape = x.shape;
    out_shape[axis] = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!input(i) || input(i)->dtype != x.dtype || input(i)->shape.size() != x.shape.size()) {
        return std::nullopt;
      }
      out_shape[axis] += input(i)->shape[axis];
    }
    HostTensor t = make(x.dtype, out_shape);
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= out_shape[i];
    for (int64_t i = axis + 1; i < rank; ++i) inner *= out_shape[i];
    int64_t pos = 0;
    for (int64_t o = 0; o < outer; ++o) {
      for (std::size_t k = 0; k < in.size(); ++k) {
        int64_t chunk = input(k)->shape[axis] * inner;
        for (int64_t j = 0; j < chunk; ++j) copy_elem(*input(k), o * chunk + j, t, pos++);
      }
    }
    return one(t);
  }
  if (op == "Slice") {
    if (opset < 10) {
      return one(slice(node, x, node.attr_ints("starts"), node.attr_ints("ends"), node.attr_ints("axes"), {}));
    }
    if (!input(1) || !input(2)) return std::nullopt;
    for (std::size_t i = 3; i < node.inputs.size(); ++i) {
      if (node.inputs[i] != ir::kNoId && !input(i)) return std::nullopt;
    }
    return one(slice(node, x, as_ints(*input(1)), as_ints(*input(2)),
                     input(3) ? as_ints(*input(3)) : std::vector<int64_t>{},
                     input(4) ? as_ints(*input(4)) : std::vector<int64_t>{}));
  }
  if (op == "Cast") {
    auto to = dtype_from_onnx(static_cast<int32_t>(node.attr_int("to", 0)));
    if (!to || !host_dtype(*to)) return std::nullopt;
    return one(cast(x, *to));
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Equal") {
    if (!input(1)) return std::nullopt;
    auto r = binary(node, x, *input(1));
    if (!r) return std::nullopt;
    return one(*r);
  }
  if (op == "Where") {
    if (!input(1) || !input(2) || input(1)->dtype != input(2)->dtype) return std::nullopt;
    const HostTensor &a = *input(1), &b = *input(2);
    auto shape = broadcast_shape({x.shape, a.shape, b.shape}, node);
    HostTensor t = make(a.dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      bool c = x.int_at(broadcast_index(x, shape, i)) != 0;
      const HostTensor& src = c ? a : b;
      copy_elem(src, broadcast_index(src, shape, i), t, i);
    }
    return one(t);
  }
  if (op == "Reshape") {
    if (!input(1)) return std::nullopt;
    auto target = as_ints(*input(1));
    bool allowzero = node.attr_int("allowzero", 0) != 0;
    int64_t known = 1, infer_at = -1;
    for (std::size_t i = 0; i < target.size(); ++i) {
      if (target[i] == 0 && !allowzero) {
        if (i >= x.shape.size()) return std::nullopt;
        target[i] = x.shape[i];
      }
      if (target[i] == -1) {
        if (infer_at >= 0) fail(ErrorKind::kModel, "node '{}' (Reshape): more than one -1", node.name);
        infer_at = static_cast<int64_t>(i);
      } else {
        known *= target[i];
      }
    }
    if (infer_at >= 0) target[infer_at] = known == 0 ? 0 : x.numel() / known;
    if (numel_of(target) != x.numel()) {
      fail(ErrorKind::kModel, "node '{}' (Reshape): cannot reshape {} elements to {}", node.name,
           x.numel(), ir::shape_string(target));
    }
    HostTensor t = x;
    t.shape = target;
    return one(t);
  }
  if (op == "Trilu") {
    if (x.shape.size() < 2) return std::nullopt;
    if (node.inputs.size() > 1 && node.inputs[1] != ir::kNoId && !input(1)) return std::nullopt;
    int64_t k = input(1) ? input(1)->int_at(0) : 0;
    bool upper = node.attr_int("upper", 1) != 0;
    int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
    HostTensor t = x;
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t c = i % cols, r = (i / cols) % rows;
      bool keep = upper ? c - r >= k : c - r <= k;
      if (!keep) set(t, i, 0, 0.0);
    }
    return one(t);
  }
  if (op == "Expand") {
    if (!input(1)) return std::nullopt;
    return one(expand(node, x, as_ints(*input(1))));
  }
  return std::nullopt;
}

}  // namespace stagecraft::passes
