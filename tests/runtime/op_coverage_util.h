#pragma once
/// \file
/// What the op coverage tests check of a model that uses an op the way exporters do.

#include <span>
#include <string>

#include "runtime/format/dtype.h"

namespace stagecraft::testing {

/// Plans `model` (batch 8, 4 microbatches, the cpu device spec) on `devices`, runs it, and
/// checks every microbatch's outputs against the whole model run as one program (within 1e-5,
/// and not all zero). Returns how many nodes of `op` the planned model keeps.
int run_against_unpartitioned(const std::string& model, int devices, const std::string& op);

/// Trains `model` (1f1b, Adam, an MSE loss) for 8 steps on one device and on 2: the loss goes
/// down, and the two runs' losses agree within 1e-5 relative.
void check_training(const std::string& model);

/// The CUDA backend takes `op` with these input dtypes (and a float32 output) as the CPU
/// backend does (nothing to check in a build without the CUDA plugin).
void check_cuda_accepts(const std::string& op, std::span<const DType> inputs);

}  // namespace stagecraft::testing
