#pragma once
/// \file
/// What a backend kernel sees: one node of a stage program with its attributes, its input
/// tensors and its output tensors. Output shapes and dtypes are static (the compiler writes them
/// into every stage file), so the program allocates outputs before the kernel runs: a kernel
/// fills `out[k]`, whose shape it may check but never changes.

#include <onnx/onnx_pb.h>

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/tensor.h"

namespace stagecraft::rt {

/// A node's attributes, read with defaults. Type mismatches and missing required attributes
/// throw `Error(kModel)` naming the attribute.
class Attrs {
 public:
  Attrs() = default;
  explicit Attrs(const onnx::NodeProto& node) : node_(&node) {}

  bool has(std::string_view name) const { return find(name) != nullptr; }
  int64_t i(std::string_view name, int64_t fallback) const;
  int64_t required_i(std::string_view name) const;
  float f(std::string_view name, float fallback) const;
  std::string s(std::string_view name, std::string_view fallback) const;
  /// Empty when absent.
  std::vector<int64_t> ints(std::string_view name) const;
  std::vector<float> floats(std::string_view name) const;
  /// Null when absent.
  const onnx::TensorProto* t(std::string_view name) const;

 private:
  const onnx::AttributeProto* find(std::string_view name) const;
  const onnx::AttributeProto& typed(std::string_view name,
                                    onnx::AttributeProto::AttributeType type) const;
  const onnx::NodeProto* node_ = nullptr;
};

/// One node of a stage program, as its kernel is called.
struct KernelArgs {
  std::string_view name;  ///< Node name (for messages).
  std::string_view op_type;
  const Attrs& attrs;
  std::span<const Tensor* const> in;  ///< One per node input; null for an omitted optional input.
  std::span<Tensor* const> out;       ///< One per node output; allocated, shape and dtype set;
                                      ///< null for an omitted optional output.
  DeviceContext& device;
  /// Where a kernel that draws random numbers (Dropout in training mode, the random ops) takes
  /// them from: the run's key (a training or inference step and microbatch, TrainingRun; 0 for
  /// an evaluation) mixed with the node's name, so a node draws the same numbers for the same
  /// step and microbatch on any device, in any stage split, and again when its forward is
  /// recomputed, and two nodes draw different ones.
  uint64_t random_key = 0;

  /// Input k; throws `Error(kModel)` when it is omitted or out of range.
  const Tensor& input(size_t k) const;
  bool has_input(size_t k) const { return k < in.size() && in[k] != nullptr; }
  size_t num_inputs() const { return in.size(); }
};

using KernelFn = void (*)(const KernelArgs& args);

/// What the backend is asked before a program is accepted: the op and the dtypes of its inputs
/// and outputs (kUndefined for an omitted optional input), and its attributes.
struct OpSignature {
  std::string_view op_type;
  std::span<const DType> inputs;
  std::span<const DType> outputs;
  const Attrs& attrs;
};

/// "" when a kernel handles the signature, else why not ("Conv on int64 inputs is not
/// supported; the cpu backend runs Conv on float32").
using CheckFn = std::string (*)(const OpSignature& signature);

/// One line of a backend's dispatch table.
struct KernelEntry {
  std::string_view op_type;
  KernelFn run;
  CheckFn check;
  /// Gradient kernels (domain ai.stagecraft) may scatter or add into their outputs, so the
  /// runtime zero-fills a gradient node's outputs before the call unless its entry says it
  /// writes every element itself. Forward kernels always write every element; those of our
  /// domain (Attention, Gelu, the mixed plans' 16-bit Conv) say so here.
  bool writes_every_output = false;
};

/// The 16-bit fallback of a kernel without a path for its 16-bit floats (Backend::runs_widened):
/// bfloat16 and float16 inputs widened to float32 copies (by `cast`, the backend's Cast
/// kernel), the float32 `kernel` run, its results rounded to nearest even into the 16-bit
/// outputs (each its own type); `zero_outputs`: the float32 outputs zero-filled first (a
/// gradient kernel that adds into them). The program runs it for such nodes; a kernel with a
/// 16-bit path for some shapes only runs it for the others.
void run_widened(KernelFn kernel, KernelFn cast, bool zero_outputs, const KernelArgs& args);

/// A check for ops whose every input and output is float32.
std::string all_float32(const OpSignature& signature);

/// Throws `Error(kShape)` naming the op when `actual` is not `expected` (a kernel's own check of
/// the output shape the compiler recorded).
void expect_shape(const KernelArgs& args, size_t output, const Shape& expected);

}  // namespace stagecraft::rt
