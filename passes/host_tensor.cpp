// Constant folding's evaluator: the output type of a node on constant inputs (the int64 shape
// arithmetic the kernels do not do), then the CPU backend's own kernel for the values.
#include "passes/host_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>

#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/format/checked.h"
#include "runtime/format/error.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/reduce_shape.h"

namespace stagecraft::passes {
namespace {

using Inputs = std::vector<std::optional<HostTensor>>;

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

/// Decodes `bytes`, laid out as `dtype` with `shape`; nullopt for a dtype folding does not handle
/// or a byte count that does not match.
std::optional<HostTensor> decode(DType dtype, const std::vector<int64_t>& shape,
                                 std::span<const std::byte> bytes) {
  if (!host_dtype(dtype)) return std::nullopt;
  HostTensor t = make(dtype, shape);
  int64_t n = t.numel();
  if (static_cast<int64_t>(bytes.size()) != n * dtype_size(dtype)) return std::nullopt;
  const std::byte* p = bytes.data();
  // One loop per dtype (the mask buffers of a 2048-token model are 4 M elements).
  auto each = [&](auto&& read) {
    for (int64_t i = 0; i < n; ++i) read(i);
  };
  switch (dtype) {
    case DType::kFloat32:
      each([&](int64_t i) {
        float f;
        std::memcpy(&f, p + i * 4, 4);
        t.reals[i] = f;
      });
      break;
    case DType::kFloat64:
      if (n > 0) std::memcpy(t.reals.data(), p, static_cast<std::size_t>(n) * 8);
      break;
    case DType::kInt32:
      each([&](int64_t i) {
        int32_t v;
        std::memcpy(&v, p + i * 4, 4);
        t.ints[i] = v;
      });
      break;
    case DType::kInt64:
      if (n > 0) std::memcpy(t.ints.data(), p, static_cast<std::size_t>(n) * 8);
      break;
    case DType::kBool:
      each([&](int64_t i) { t.ints[i] = static_cast<int64_t>(p[i] != std::byte{0}); });
      break;
    default:
      return std::nullopt;
  }
  return t;
}

/// Writes `t`'s elements at `p` in its dtype's layout (numel x element size bytes).
void encode(const HostTensor& t, char* p) {
  const int64_t n = t.numel();
  auto each = [&](auto&& write) {
    for (int64_t i = 0; i < n; ++i) write(i);
  };
  switch (t.dtype) {
    case DType::kFloat32:
      each([&](int64_t i) {
        auto f = static_cast<float>(t.reals[i]);
        std::memcpy(p + i * 4, &f, 4);
      });
      break;
    case DType::kFloat64:
      if (n > 0) std::memcpy(p, t.reals.data(), static_cast<std::size_t>(n) * 8);
      break;
    case DType::kInt32:
      each([&](int64_t i) {
        auto v = static_cast<int32_t>(t.ints[i]);
        std::memcpy(p + i * 4, &v, 4);
      });
      break;
    case DType::kInt64:
      if (n > 0) std::memcpy(p, t.ints.data(), static_cast<std::size_t>(n) * 8);
      break;
    case DType::kBool:
      each([&](int64_t i) { p[i] = static_cast<char>(t.ints[i] != 0); });
      break;
    default:
      break;
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

/// The output shape of a Slice of `shape` (the bounds clamped as ONNX says).
std::vector<int64_t> slice_shape(const ir::Node& node, std::vector<int64_t> shape,
                                 const std::vector<int64_t>& starts,
                                 const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                                 std::vector<int64_t> steps) {
  auto rank = static_cast<int64_t>(shape.size());
  if (axes.empty()) {
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size()) {
    fail(ErrorKind::kModel, "node '{}' (Slice): starts, ends, axes and steps differ in length",
         node.name);
  }
  for (std::size_t k = 0; k < starts.size(); ++k) {
    int64_t a = normalize_axis(axes[k], rank, node);
    int64_t dim = shape[a], st = steps[k];
    if (st == 0) fail(ErrorKind::kModel, "node '{}' (Slice): step is 0", node.name);
    int64_t s = std::clamp<int64_t>(starts[k], -dim - 1, dim + 1);
    int64_t e = std::clamp<int64_t>(ends[k], -dim - 1, dim + 1);
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    // ceil(span / |step|) as (span - 1) / |step| + 1: never forms span + |step| (a step near
    // 2^63 would wrap), nor -INT64_MIN.
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      shape[a] = e > s ? (e - s - 1) / st + 1 : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      shape[a] =
          s > e ? (st == std::numeric_limits<int64_t>::min() ? 1 : (s - e - 1) / -st + 1) : 0;
    }
  }
  return shape;
}

std::vector<int64_t> reshape_shape(const ir::Node& node, const HostTensor& x,
                                   std::vector<int64_t> target) {
  bool allowzero = node.attr_int("allowzero", 0) != 0;
  int64_t known = 1, infer_at = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    if (target[i] == 0 && !allowzero) {
      if (i >= x.shape.size()) return {-1};
      target[i] = x.shape[i];
    }
    if (target[i] == -1) {
      if (infer_at >= 0)
        fail(ErrorKind::kModel, "node '{}' (Reshape): more than one -1", node.name);
      infer_at = static_cast<int64_t>(i);
    } else if (target[i] < 0) {
      fail(ErrorKind::kModel,
           "node '{}' (Reshape): shape {} entry {} is {}; only -1 may be negative", node.name,
           ir::shape_string(target), i, target[i]);
    } else {
      std::optional<int64_t> product = try_mul(known, target[i]);
      if (!product) {
        fail(ErrorKind::kModel,
             "node '{}' (Reshape): the element count of shape {} overflows int64", node.name,
             ir::shape_string(target));
      }
      known = *product;
    }
  }
  if (infer_at >= 0) target[infer_at] = known == 0 ? 0 : x.numel() / known;
  if (numel_of(target) != x.numel()) {
    fail(ErrorKind::kModel, "node '{}' (Reshape): cannot reshape {} elements to {}", node.name,
         x.numel(), ir::shape_string(target));
  }
  return target;
}

/// Squeeze (`squeeze`) or Unsqueeze of `shape` at `axes`.
std::vector<int64_t> squeeze_shape(const ir::Node& node, const std::vector<int64_t>& shape,
                                   std::vector<int64_t> axes, bool squeeze) {
  std::vector<int64_t> out;
  if (!squeeze) {
    out = shape;
    auto rank = static_cast<int64_t>(shape.size() + axes.size());
    for (auto& a : axes) a = normalize_axis(a, rank, node);
    std::sort(axes.begin(), axes.end());
    for (int64_t a : axes) out.insert(out.begin() + a, 1);
    return out;
  }
  auto rank = static_cast<int64_t>(shape.size());
  std::vector<bool> drop(rank, axes.empty());
  for (int64_t a : axes) {
    a = normalize_axis(a, rank, node);
    if (shape[a] != 1) {
      fail(ErrorKind::kModel, "node '{}' (Squeeze): dim {} has size {}, not 1", node.name, a,
           shape[a]);
    }
    drop[a] = true;
  }
  for (int64_t i = 0; i < rank; ++i) {
    if (!drop[i] || shape[i] != 1) out.push_back(shape[i]);
  }
  return out;
}

/// The lowest and highest value of an integer dtype folding handles (int32 or int64).
std::pair<int64_t, int64_t> int_limits(DType dtype) {
  if (dtype == DType::kInt32)
    return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
}

/// Range's element count as the kernel computes it: the difference in the element type, the
/// division in double. An integer difference or last element that leaves the element type is
/// refused, naming the node: the kernel would wrap it.
double range_count(const ir::Node& node, const HostTensor& start, const HostTensor& limit,
                   const HostTensor& delta) {
  double diff = 0;
  if (start.dtype == DType::kFloat32) {
    diff =
        static_cast<float>(static_cast<float>(limit.reals[0]) - static_cast<float>(start.reals[0]));
  } else if (start.is_real()) {
    diff = limit.reals[0] - start.reals[0];
  } else {
    auto [lo, hi] = int_limits(start.dtype);
    std::optional<int64_t> d = try_sub(limit.ints[0], start.ints[0]);
    if (!d || *d < lo || *d > hi) {
      fail(ErrorKind::kModel, "node '{}' (Range): limit - start = {} - {} overflows {}", node.name,
           limit.ints[0], start.ints[0], dtype_name(start.dtype));
    }
    diff = static_cast<double>(*d);
  }
  double count = std::ceil(diff / delta.real_at(0));
  if (!start.is_real() && count >= 1 && count <= 9.0e18) {
    auto [lo, hi] = int_limits(start.dtype);
    std::optional<int64_t> steps = try_mul(static_cast<int64_t>(count) - 1, delta.ints[0]);
    std::optional<int64_t> last = steps ? try_add(start.ints[0], *steps) : std::nullopt;
    if (!last || *last < lo || *last > hi) {
      fail(ErrorKind::kModel,
           "node '{}' (Range): the last of {} elements, {} + {} x {}, overflows {}", node.name,
           static_cast<int64_t>(count), start.ints[0], static_cast<int64_t>(count) - 1,
           delta.ints[0], dtype_name(start.dtype));
    }
  }
  return count;
}

/// The flat index into an input of `in_shape`, broadcast (numpy rules) to `out_shape`, that
/// output element `i` reads.
int64_t broadcast_index(const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
                        int64_t i) {
  int64_t index = 0, stride = 1;
  const std::size_t offset = out_shape.size() - in_shape.size();
  for (std::size_t k = out_shape.size(); k-- > 0;) {
    const int64_t coord = i % out_shape[k];
    i /= out_shape[k];
    if (k < offset) continue;
    const int64_t d = in_shape[k - offset];
    if (d != 1) index += coord * stride;
    stride *= d;
  }
  return index;
}

/// Integer Add, Sub, Mul, Div and Mod element by element, refusing (naming the node) any result
/// that leaves the element type and a zero divisor. The kernel wraps, as the runtime must; a
/// shape computed by wrapping is a broken or hostile model, not a size.
void check_integer_arithmetic(const ir::Node& node, const HostTensor& x, const HostTensor& y,
                              const std::vector<int64_t>& out_shape) {
  if (x.is_real() || x.dtype == DType::kBool) return;
  const std::string& op = node.op_type;
  const auto [lo, hi] = int_limits(x.dtype);
  const int64_t n = numel_of(out_shape);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = x.ints[broadcast_index(x.shape, out_shape, i)];
    const int64_t b = y.ints[broadcast_index(y.shape, out_shape, i)];
    std::optional<int64_t> r;
    const char* symbol = "/";
    if (op == "Add") {
      r = try_add(a, b), symbol = "+";
    } else if (op == "Sub") {
      r = try_sub(a, b), symbol = "-";
    } else if (op == "Mul") {
      r = try_mul(a, b), symbol = "x";
    } else if (b == 0) {
      fail(ErrorKind::kModel, "node '{}' ({}): integer {} by zero ({} {} 0, element {})", node.name,
           op, op == "Mod" ? "modulo" : "division", a, op == "Mod" ? "%" : "/", i);
    } else if (op == "Mod") {
      r = 0;  // a remainder always fits (the lowest value mod -1 is 0)
    } else if (!(a == std::numeric_limits<int64_t>::min() && b == -1)) {
      r = a / b;
    }
    if (!r || *r < lo || *r > hi) {
      fail(ErrorKind::kModel, "node '{}' ({}): {} {} {} overflows {} (element {} of the output)",
           node.name, op, a, symbol, b, dtype_name(x.dtype), i);
    }
  }
}

/// Integer Neg and Abs, refusing (naming the node) the lowest value of the type, whose negation
/// does not fit: the kernel wraps it back to itself.
void check_integer_negation(const ir::Node& node, const HostTensor& x) {
  if (x.is_real() || x.dtype == DType::kBool) return;
  const int64_t lo = int_limits(x.dtype).first;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (x.ints[i] == lo)
      fail(ErrorKind::kModel, "node '{}' ({}): the negation of {} overflows {} (element {})",
           node.name, node.op_type, lo, dtype_name(x.dtype), i);
  }
}

/// True when a folded output of `shape` holds at most `max_elements`; a negative dim is refused,
/// naming the node.
bool small_enough(const ir::Node& node, const std::vector<int64_t>& shape, int64_t max_elements) {
  int64_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      fail(ErrorKind::kModel, "node '{}' ({}): output shape {} has a negative dim ({} at {})",
           node.name, node.op_type, ir::shape_string(shape), shape[i], i);
    }
  }
  for (int64_t d : shape) {
    std::optional<int64_t> product = try_mul(n, d);
    if (!product) return false;
    n = *product;
  }
  return n <= max_elements;
}

/// `t` as a runtime tensor, for the CPU backend's kernels and rules.
rt::Tensor to_tensor(const HostTensor& t) {
  rt::Tensor tensor = rt::Tensor::owned(t.dtype, t.shape);
  if (t.numel() > 0) encode(t, reinterpret_cast<char*>(tensor.data));
  return tensor;
}

/// The node's attributes as the kernels read them.
onnx::NodeProto attribute_proto(const ir::Node& node) {
  onnx::NodeProto proto;
  proto.set_op_type(node.op_type);
  for (const auto& a : node.attributes) *proto.add_attribute() = a;
  return proto;
}

/// One host context per thread: folding runs the small, single-threaded shape kernels.
rt::DeviceContext& host_device() {
  thread_local const std::unique_ptr<rt::DeviceContext> device =
      rt::cpu_backend().make_device(0, 1);
  return *device;
}

/// A reduction's output shape by the kernels' own rule (runtime/ops/reduce_shape.h: axes from
/// the attribute or the constant operand 1, keepdims, noop_with_empty_axes); nullopt when the
/// axes operand is not constant. A bad axis is refused naming the node.
std::optional<std::vector<int64_t>> reduced_shape(const ir::Node& node, const Inputs& in) {
  std::optional<rt::Tensor> axes;
  if (node.inputs.size() > 1 && node.inputs[1] != ir::kNoId) {
    if (in.size() < 2 || !in[1]) return std::nullopt;
    axes = to_tensor(*in[1]);
  }
  const onnx::NodeProto proto = attribute_proto(node);
  const rt::Attrs attrs(proto);
  const rt::Tensor* args[] = {nullptr, axes ? &*axes : nullptr};
  const rt::KernelArgs a{node.name, node.op_type, attrs, args, {}, host_device()};
  try {
    return rt::ops::reduced_dims(a, in[0]->shape, axes ? &*axes : nullptr).y_shape;
  } catch (Error& e) {
    throw std::move(e.in(fmt::format("node '{}' ({})", node.name, node.op_type)));
  }
}

/// Transpose's output shape (perm, default the dims reversed); nullopt for a perm the kernel
/// refuses (it names the node and says why at run time).
std::optional<std::vector<int64_t>> transpose_shape(const ir::Node& node,
                                                    const std::vector<int64_t>& in) {
  std::vector<int64_t> perm = node.attr_ints("perm");
  const auto rank = static_cast<int64_t>(in.size());
  if (perm.empty()) {
    perm.resize(in.size());
    std::iota(perm.rbegin(), perm.rend(), 0);
  }
  if (static_cast<int64_t>(perm.size()) != rank) return std::nullopt;
  std::vector<int64_t> shape;
  for (int64_t p : perm) {
    if (p < -rank || p >= rank) return std::nullopt;
    shape.push_back(in[p < 0 ? p + rank : p]);
  }
  return shape;
}

/// Output 0's dtype and shape for the arithmetic ops folding handles (comparisons and logic,
/// Min and Max, the reductions of detection transforms, the unary and binary maths, Where);
/// nullopt for another op, or one that cannot fold here.
std::optional<std::pair<DType, std::vector<int64_t>>> arithmetic_type(const ir::Node& node,
                                                                      const Inputs& in,
                                                                      int64_t max_elements) {
  const std::string& op = node.op_type;
  auto input = [&](std::size_t i) -> const HostTensor* {
    return i < in.size() && in[i] ? &*in[i] : nullptr;
  };
  const HostTensor& x = *input(0);
  using Type = std::pair<DType, std::vector<int64_t>>;
  if (op == "Greater" || op == "Less" || op == "GreaterOrEqual" || op == "LessOrEqual" ||
      op == "And" || op == "Or" || op == "Mod") {
    if (!input(1) || input(1)->dtype != x.dtype) return std::nullopt;
    std::vector<int64_t> shape = broadcast_shape({x.shape, input(1)->shape}, node);
    if (!small_enough(node, shape, max_elements)) return std::nullopt;
    if (op == "Mod") {
      check_integer_arithmetic(node, x, *input(1), shape);
      return Type{x.dtype, shape};
    }
    return Type{DType::kBool, shape};
  }
  if (op == "Min" || op == "Max") {
    std::vector<std::vector<int64_t>> shapes;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!input(i) || input(i)->dtype != x.dtype) return std::nullopt;
      shapes.push_back(input(i)->shape);
    }
    return Type{x.dtype, broadcast_shape(shapes, node)};
  }
  // Detection models' input transforms: the scale from the image size (ReduceMin / ReduceMax
  // of its dims, Reciprocal).
  if (op == "ReduceMin" || op == "ReduceMax") {
    std::optional<std::vector<int64_t>> shape = reduced_shape(node, in);
    if (!shape) return std::nullopt;
    return Type{x.dtype, *shape};
  }
  if (op == "Reciprocal") {
    if (!x.is_real()) return std::nullopt;
    return Type{x.dtype, x.shape};
  }
  if (op == "Neg" || op == "Abs" || op == "Ceil" || op == "Floor" || op == "Not") {
    if (op == "Neg" || op == "Abs") check_integer_negation(node, x);
    return Type{x.dtype, x.shape};
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Equal") {
    if (!input(1) || input(1)->dtype != x.dtype) return std::nullopt;
    std::vector<int64_t> shape = broadcast_shape({x.shape, input(1)->shape}, node);
    if (!small_enough(node, shape, max_elements)) return std::nullopt;
    if (op != "Equal") check_integer_arithmetic(node, x, *input(1), shape);
    return Type{op == "Equal" ? DType::kBool : x.dtype, shape};
  }
  if (op == "Where") {
    if (!input(1) || !input(2) || input(1)->dtype != input(2)->dtype) return std::nullopt;
    return Type{input(1)->dtype,
                broadcast_shape({x.shape, input(1)->shape, input(2)->shape}, node)};
  }
  return std::nullopt;
}

/// Output 0's dtype and shape: the shape arithmetic of folding. Nullopt when an input it needs
/// is not constant, the node is outside what folding handles, or the output would hold more
/// than `max_elements` (then the node stays, and runs at run time).
std::optional<std::pair<DType, std::vector<int64_t>>> output_type(const ir::Node& node,
                                                                  const Inputs& in, int64_t opset,
                                                                  int64_t max_elements) {
  const std::string& op = node.op_type;
  auto input = [&](std::size_t i) -> const HostTensor* {
    return i < in.size() && in[i] ? &*in[i] : nullptr;
  };
  // An operand the node names (not omitted) that is not constant.
  auto unknown = [&](std::size_t i) {
    return i < node.inputs.size() && node.inputs[i] != ir::kNoId && !input(i);
  };
  const HostTensor& x = *input(0);
  using Type = std::pair<DType, std::vector<int64_t>>;
  if (op == "Identity") return Type{x.dtype, x.shape};
  if (op == "Cast") {
    auto to = dtype_from_onnx(static_cast<int32_t>(node.attr_int("to", 0)));
    if (!to || !host_dtype(*to)) return std::nullopt;
    return Type{*to, x.shape};
  }
  if (op == "ConstantOfShape") {
    DType dtype = DType::kFloat32;
    if (const auto* a = node.attribute("value")) {
      auto d = dtype_from_onnx(a->t().data_type());
      if (!d || !host_dtype(*d) || numel_of({a->t().dims().begin(), a->t().dims().end()}) != 1)
        return std::nullopt;
      dtype = *d;
    }
    return Type{dtype, as_ints(x)};
  }
  if (op == "Range") {
    if (!input(1) || !input(2)) return std::nullopt;
    if (input(2)->real_at(0) == 0)
      fail(ErrorKind::kModel, "node '{}' (Range): delta is 0", node.name);
    auto n = static_cast<int64_t>(std::max(0.0, range_count(node, x, *input(1), *input(2))));
    if (n > (1 << 24)) return std::nullopt;
    return Type{x.dtype, {n}};
  }
  // An arithmetic op that cannot fold falls through to nullopt below.
  if (auto arithmetic = arithmetic_type(node, in, max_elements)) return arithmetic;
  if (op == "Gather") {
    if (!input(1)) return std::nullopt;
    int64_t axis =
        normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(x.shape.size()), node);
    std::vector<int64_t> shape(x.shape.begin(), x.shape.begin() + axis);
    shape.insert(shape.end(), input(1)->shape.begin(), input(1)->shape.end());
    shape.insert(shape.end(), x.shape.begin() + axis + 1, x.shape.end());
    return Type{x.dtype, shape};
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    if (opset >= 13 && unknown(1)) return std::nullopt;
    std::vector<int64_t> axes = opset >= 13
                                    ? (input(1) ? as_ints(*input(1)) : std::vector<int64_t>{})
                                    : node.attr_ints("axes");
    return Type{x.dtype, squeeze_shape(node, x.shape, axes, op == "Squeeze")};
  }
  if (op == "Concat") {
    int64_t axis =
        normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(x.shape.size()), node);
    std::vector<int64_t> shape = x.shape;
    shape[axis] = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (!input(i) || input(i)->dtype != x.dtype || input(i)->shape.size() != x.shape.size())
        return std::nullopt;
      shape[axis] += input(i)->shape[axis];
    }
    return Type{x.dtype, shape};
  }
  if (op == "Slice") {
    if (opset < 10) {
      return Type{x.dtype, slice_shape(node, x.shape, node.attr_ints("starts"),
                                       node.attr_ints("ends"), node.attr_ints("axes"), {})};
    }
    if (!input(1) || !input(2) || unknown(3) || unknown(4)) return std::nullopt;
    return Type{x.dtype, slice_shape(node, x.shape, as_ints(*input(1)), as_ints(*input(2)),
                                     input(3) ? as_ints(*input(3)) : std::vector<int64_t>{},
                                     input(4) ? as_ints(*input(4)) : std::vector<int64_t>{})};
  }
  if (op == "Reshape") {
    if (!input(1)) return std::nullopt;
    auto shape = reshape_shape(node, x, as_ints(*input(1)));
    if (shape == std::vector<int64_t>{-1}) return std::nullopt;
    return Type{x.dtype, shape};
  }
  if (op == "Expand") {
    if (!input(1)) return std::nullopt;
    return Type{x.dtype, broadcast_shape({x.shape, as_ints(*input(1))}, node)};
  }
  if (op == "Transpose") {
    std::optional<std::vector<int64_t>> shape = transpose_shape(node, x.shape);
    if (!shape) return std::nullopt;
    return Type{x.dtype, *shape};
  }
  if (op == "Tile") {
    if (!input(1) || input(1)->numel() != static_cast<int64_t>(x.shape.size())) return std::nullopt;
    std::vector<int64_t> shape = x.shape;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const int64_t repeat = input(1)->int_at(static_cast<int64_t>(d));
      if (repeat < 0) return std::nullopt;  // the kernel names the node and the repeat
      std::optional<int64_t> dim = try_mul(shape[d], repeat);
      if (!dim) return std::nullopt;
      shape[d] = *dim;
    }
    return Type{x.dtype, shape};
  }
  // Swin's shifted-window masks: slices of a constant set by index.
  if (op == "ScatterND") {
    if (!input(1) || !input(2) || input(2)->dtype != x.dtype) return std::nullopt;
    return Type{x.dtype, x.shape};
  }
  return std::nullopt;
}

/// Runs the CPU backend's kernel for `node` on `in`, its one output of `type`; nullopt when the
/// backend's check refuses the signature. The kernel's errors are given the node's name.
/// `first`, when given, is input 0 as the kernel reads it (`in[0]` then gives its dtype only).
std::optional<rt::Tensor> run_kernel_tensor(const ir::Node& node, const Inputs& in,
                                            const std::pair<DType, std::vector<int64_t>>& type,
                                            const rt::Tensor* first = nullptr) {
  const rt::Backend& backend = rt::cpu_backend();
  const onnx::NodeProto proto = attribute_proto(node);
  const rt::Attrs attrs(proto);
  std::vector<DType> in_types, out_types{type.first};
  std::vector<rt::Tensor> tensors;
  tensors.reserve(in.size());
  std::vector<const rt::Tensor*> args;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto& t = in[i];
    in_types.push_back(t ? t->dtype : DType::kUndefined);
    if (!t) {
      args.push_back(nullptr);
      continue;
    }
    args.push_back(i == 0 && first ? first : &tensors.emplace_back(to_tensor(*t)));
  }
  if (!backend.check({node.op_type, in_types, out_types, attrs}).empty()) return std::nullopt;
  rt::Tensor out = rt::Tensor::owned(type.first, type.second);
  rt::Tensor* outs[] = {&out};
  try {
    backend.kernel(node.op_type)({node.name, node.op_type, attrs, args, outs, host_device()});
  } catch (Error& e) {
    throw std::move(e.in(fmt::format("node '{}' ({})", node.name, node.op_type)));
  }
  return out;
}

std::optional<HostTensor> run_kernel(const ir::Node& node, const Inputs& in,
                                     const std::pair<DType, std::vector<int64_t>>& type) {
  const std::optional<rt::Tensor> out = run_kernel_tensor(node, in, type);
  if (!out) return std::nullopt;
  return decode(out->dtype, out->shape, {out->data, static_cast<std::size_t>(out->bytes())});
}

/// Shape: dims [start, end) of the input's shape.
HostTensor shape_of(const ir::Node& node, const std::vector<int64_t>& shape_input) {
  auto rank = static_cast<int64_t>(shape_input.size());
  int64_t start = node.attr_int("start", 0), end = node.attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, start, rank);
  HostTensor t = make(DType::kInt64, {end - start});
  for (int64_t i = start; i < end; ++i) t.ints[i - start] = shape_input[i];
  return t;
}

/// Trilu: the CPU kernel, as the other folds run, but whatever the mask's size (evaluate_on_host
/// calls it before the size check: a causal mask of a model's whole context folds).
std::optional<HostTensor> trilu(const ir::Node& node, const Inputs& in) {
  const HostTensor& x = *in[0];
  if (x.shape.size() < 2) return std::nullopt;
  const bool k_named = node.inputs.size() > 1 && node.inputs[1] != ir::kNoId;
  if (k_named && !(in.size() > 1 && in[1])) return std::nullopt;
  return run_kernel(node, in, {x.dtype, x.shape});
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

int64_t HostTensor::numel() const {
  return static_cast<int64_t>(is_real() ? reals.size() : ints.size());
}

int64_t HostTensor::int_at(int64_t i) const {
  return is_real() ? static_cast<int64_t>(reals[i]) : ints[i];
}

double HostTensor::real_at(int64_t i) const {
  return is_real() ? reals[i] : static_cast<double>(ints[i]);
}

std::optional<HostTensor> HostTensor::from_value(const ir::Value& value) {
  if (!value.initializer || !host_dtype(value.dtype) || !value.shape_known) return std::nullopt;
  return decode(value.dtype, value.shape, value.initializer->bytes());
}

std::string HostTensor::to_bytes() const {
  std::string out(static_cast<std::size_t>(numel() * dtype_size(dtype)), '\0');
  encode(*this, out.data());
  return out;
}

std::optional<std::vector<HostTensor>> evaluate_on_host(const ir::Node& node, const Inputs& in,
                                                        const std::vector<int64_t>& shape_input,
                                                        int64_t opset,
                                                        int64_t max_output_elements) {
  auto one = [](std::optional<HostTensor> t) -> std::optional<std::vector<HostTensor>> {
    if (!t) return std::nullopt;
    std::vector<HostTensor> out;  // moved in (a braced list would copy it)
    out.push_back(std::move(*t));
    return out;
  };
  if (node.op_type == "Shape") return one(shape_of(node, shape_input));
  // Every other op needs its first input constant.
  if (in.empty() || !in[0]) return std::nullopt;
  if (node.op_type == "Trilu") return one(trilu(node, in));
  if (node.op_type == "Split") return split_on_host(node, in, opset, max_output_elements);
  auto type = output_type(node, in, opset, max_output_elements);
  // Checked before the kernel allocates: a ConstantOfShape of [2^31] is 8 GiB of zeros.
  if (!type || !small_enough(node, type->second, max_output_elements)) return std::nullopt;
  return one(run_kernel(node, in, *type));
}

std::optional<std::vector<uint8_t>> bool_slice_on_host(const ir::Node& node,
                                                       const std::vector<int64_t>& shape,
                                                       std::span<const std::byte> data,
                                                       const Inputs& rest, int64_t opset) {
  if (node.op_type != "Slice" || opset < 10 || rest.size() < 2) return std::nullopt;
  if (static_cast<int64_t>(data.size()) != numel_of(shape)) return std::nullopt;
  std::vector<rt::Tensor> operands;
  operands.reserve(rest.size());
  std::vector<const rt::Tensor*> args{nullptr};  // input 0 is read from `data` below
  const std::size_t operands_named = node.inputs.empty() ? 0 : node.inputs.size() - 1;
  for (std::size_t k = 0; k < std::max(rest.size(), operands_named); ++k) {
    const bool named = k + 1 < node.inputs.size() && node.inputs[k + 1] != ir::kNoId;
    const bool given = k < rest.size() && rest[k];
    if (named && !given) return std::nullopt;
    if (given && rest[k]->is_real()) return std::nullopt;
    args.push_back(given ? &operands.emplace_back(to_tensor(*rest[k])) : nullptr);
  }
  const onnx::NodeProto proto = attribute_proto(node);
  const rt::Attrs attrs(proto);
  const rt::KernelArgs a{node.name, node.op_type, attrs, args, {}, host_device()};
  rt::ops::SliceView view;
  try {
    view = rt::ops::slice_view(a, shape, args.size(),
                               [&](std::size_t k) { return k < args.size() ? args[k] : nullptr; });
  } catch (const Error&) {
    return std::nullopt;  // the general path names what is wrong
  }
  std::vector<uint8_t> out(static_cast<std::size_t>(numel_of(view.shape)));
  if (out.empty()) return out;
  // Row by row of the merged walk (the kernels' strided copy), each byte made 0 or 1.
  const rt::ops::StridedWalk walk = rt::ops::merge_strided_dims(view.shape, view.strides);
  const auto rank = static_cast<int64_t>(walk.dims.size());
  const int64_t inner = walk.dims.back(), step = walk.steps.back();
  const int64_t rows = static_cast<int64_t>(out.size()) / inner;
  const std::byte* src = data.data() + view.base;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0, left = r;
    for (int64_t d = rank - 2; d >= 0; --d) {
      offset += (left % walk.dims[d]) * walk.steps[d];
      left /= walk.dims[d];
    }
    const std::byte* from = src + offset;
    uint8_t* to = out.data() + r * inner;
    if (step == 1) {  // a contiguous row, which the compiler vectorizes
      for (int64_t i = 0; i < inner; ++i) to[i] = from[i] != std::byte{0};
    } else {
      for (int64_t i = 0; i < inner; ++i) to[i] = from[i * step] != std::byte{0};
    }
  }
  return out;
}

}  // namespace stagecraft::passes
