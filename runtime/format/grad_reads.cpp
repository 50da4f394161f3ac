#include "runtime/format/grad_reads.h"

#include <cstdint>

namespace stagecraft::grad {

namespace {

/// The operands one gradient reads the bytes of: forward inputs 0..30 by bit, any later input
/// as `later_inputs` says (Concat's), forward outputs by bit.
struct ReadRule {
  std::string_view op;
  uint32_t inputs;
  bool later_inputs;
  uint32_t outputs;
};

constexpr uint32_t kNone = 0;
constexpr uint32_t kAll = ~uint32_t{0};
constexpr uint32_t bit(int k) { return uint32_t{1} << k; }
/// Every input but the data (input 0): the shape, axes, starts, split or ratio operands, which
/// are small integers where a file has them as values at all.
constexpr uint32_t kAllButData = kAll & ~bit(0);

// Each row was checked against the CPU and the CUDA kernels (runtime/{cpu,cuda}/grad_*.cpp,
// activations.cpp, loss.cpp): an operand left out is read for its shape only.
constexpr ReadRule kRules[] = {
    // dY passed on (summed where an operand was broadcast): shapes only.
    {"Add", kNone, false, kNone},
    {"Sub", kNone, false, kNone},
    // Each operand's gradient reads the other operand; Y is not read.
    {"Mul", bit(0) | bit(1), false, kNone},
    {"Div", bit(0) | bit(1), false, kNone},
    {"MatMul", bit(0) | bit(1), false, kNone},
    {"Gemm", bit(0) | bit(1) | bit(2), false, kNone},
    {"Conv", bit(0) | bit(1) | bit(2), false, kNone},
    // Layout: dY moved back into X's shape.
    {"Reshape", kAllButData, true, kNone},
    {"Flatten", kNone, false, kNone},
    {"Squeeze", kAllButData, true, kNone},
    {"Unsqueeze", kAllButData, true, kNone},
    {"Identity", kNone, false, kNone},
    {"Transpose", kNone, false, kNone},
    {"Expand", kAllButData, true, kNone},
    {"Slice", kAllButData, true, kNone},
    {"Trilu", kAllButData, true, kNone},
    {"Split", kAllButData, true, kNone},
    {"Concat", kNone, false, kNone},
    {"Cast", kNone, false, kNone},
    {"ReduceMean", kAllButData, true, kNone},
    // The indices, not the table.
    {"Gather", bit(1), false, kNone},
    // The condition, not the values.
    {"Where", bit(0), false, kNone},
    // The mask (output 1) and the ratio and training_mode operands.
    {"Dropout", kAllButData, true, bit(1)},
    // dX = Y (dY - sum(dY Y)).
    {"Softmax", kNone, false, bit(0)},
    // dX = dY - exp(Y) sum(dY).
    {"LogSoftmax", kNone, false, bit(0)},
    // The statistics are recomputed from X: neither Y nor Mean nor InvStdDev is read.
    {"LayerNormalization", kAll, true, kNone},
    {"BatchNormalization", kAll, true, kNone},
    {"SoftmaxCrossEntropyLoss", kAll, true, kNone},
    // -w at each label: the labels and the class weights, the input's shape only.
    {"NegativeLogLikelihoodLoss", bit(1) | bit(2), false, kNone},
    // Functions of X alone (the kernels recompute what they need of Y).
    {"Gelu", bit(0), false, kNone},
    // dX = dY where Y > 0, which is where X > 0: Y is read, not X, so a network's
    // Conv -> BatchNormalization -> Relu keeps Relu's output (which the next Conv's gradient
    // reads anyway) and not the normalization's (ResNet: a third of its activations).
    {"Relu", kNone, false, bit(0)},
};

const ReadRule* find_rule(std::string_view op) {
  for (const ReadRule& r : kRules)
    if (r.op == op) return &r;
  return nullptr;
}

}  // namespace

bool reads_bytes(std::string_view forward_op, std::size_t n, std::size_t position) {
  const ReadRule* r = find_rule(forward_op);
  if (r == nullptr) return true;
  if (position < n)
    return position < 31 ? (r->inputs & bit(static_cast<int>(position))) != 0 : r->later_inputs;
  const std::size_t j = position - n;
  return j < 32 && (r->outputs & bit(static_cast<int>(j))) != 0;
}

bool has_read_rule(std::string_view forward_op) { return find_rule(forward_op) != nullptr; }

}  // namespace stagecraft::grad
