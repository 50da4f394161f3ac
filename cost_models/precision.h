#pragma once
/// \file
/// The numeric precision a plan trains or infers in. Shared by the roofline (which peak FLOP/s
/// and how many bytes per element) and the memory model (bytes per parameter).

#include <string_view>

namespace stagecraft::cost {

/// How tensors are stored and multiplied.
enum class Precision {
  kFp32,   ///< Everything in fp32.
  kMixed,  ///< 16-bit (bf16/fp16) activations and matrix products; fp32 master weights,
           ///< gradients and optimizer states when training.
};

/// "fp32" or "mixed".
std::string_view to_string(Precision precision);

/// The precision called `name` ("fp32", "mixed"); throws `Error(kUsage)` listing the valid
/// names otherwise.
Precision parse_precision(std::string_view name);

}  // namespace stagecraft::cost
