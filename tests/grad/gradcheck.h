#pragma once
/// \file
/// Finite-difference checks of gradient kernels. A case is one forward node: the harness runs
/// it (shapes from ONNX shape inference), draws a random weighting r_j of each float output,
/// runs the node's gradient op (runtime/format/grad_ops.h) with dy_j = r_j, and compares each
/// checked dx_k with the central difference of L = sum_j <y_j, r_j> at sampled elements.

#include <onnx/onnx_pb.h>

#include <functional>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace stagecraft::testing {

struct GradCase {
  std::string op;      ///< Forward op type.
  std::string domain;  ///< The forward op's domain: "" (ONNX's) or ai.stagecraft (a fused op).
  /// The forward outputs' shapes (float32), for an op ONNX's shape inference does not know
  /// (ai.stagecraft's); empty: inferred.
  std::vector<rt::Shape> output_shapes;
  std::vector<rt::Tensor> inputs;               ///< dtype kUndefined: an omitted optional input.
  std::function<void(onnx::NodeProto&)> attrs;  ///< Sets the forward node's attributes.
  std::vector<bool> check;                      ///< Per input: compare its gradient (float32 only).
  int outputs = 1;                              ///< How many outputs the forward node has.
  int opset = 17;
  double eps = 1e-3;
  double rtol = 2e-2, atol = 2e-3;
  int samples = 24;  ///< Elements checked per input.
  /// Make int64 inputs initializers of the forward model, so shape inference sees their values
  /// (Reshape, Expand, Slice from opset 10 take their output shape from an input's values).
  bool int64_as_constants = false;
  /// Per input: make it an initializer of the forward model whatever its dtype (Resize's float
  /// scales give its output shape).
  std::vector<bool> constant;
  /// Per output: leave its gradient out (dy_j is "" and y_j is not in the loss).
  std::vector<bool> no_dy;
  /// Optional: perturbations must keep the op smooth (e.g. Relu at 0, MaxPool ties); the case
  /// may fix inputs to avoid kinks instead.
};

/// Random float32 tensor, uniform in [lo, hi), from a fixed seed.
rt::Tensor random_tensor(const rt::Shape& shape, float lo = -1.0f, float hi = 1.0f,
                         unsigned seed = 1);

/// An int64 tensor holding `values` with `shape`.
rt::Tensor int64_tensor(const rt::Shape& shape, const std::vector<int64_t>& values);

/// Attribute setters for the forward node of a case.
void set_int(onnx::NodeProto& node, const std::string& name, int64_t value);
void set_ints(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values);
void set_float(onnx::NodeProto& node, const std::string& name, float value);
void set_string(onnx::NodeProto& node, const std::string& name, const std::string& value);

/// The backend the gradient checks run on: $STAGECRAFT_TEST_BACKEND, else "cpu".
std::string test_backend();

/// Runs the check; reports failures through doctest CHECKs naming the op, input and element.
/// Every case also checks the runtime's contract for gradient outputs (rt::KernelEntry's
/// `writes_every_output`): a kernel whose entry says so gives, called on outputs of NaN, bit
/// for bit what it gives on zeros, and zeros with every dy omitted; and a kernel that adds into
/// its outputs (every gradient kernel, wrapped to do so and left unmarked) gets zero-filled
/// outputs from the runtime even where they lie in an arena full of garbage.
///
/// The case runs on the backend named `backend` (runtime/core/backend.h) and, as the
/// reference, on the CPU backend: the backend's forward outputs and gradients must match the
/// CPU's (within the case's tolerance; bit for bit on the CPU itself). Adding a backend to the
/// checks is adding its name.
void gradcheck(const GradCase& c, const std::string& backend = test_backend());

}  // namespace stagecraft::testing
