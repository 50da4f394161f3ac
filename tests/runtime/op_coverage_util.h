#pragma once
/// \file
/// What the op coverage tests check of a model that uses an op the way exporters do.

#include <cstdint>
#include <span>
#include <string>

#include "runtime/format/dtype.h"
#include "samples/builder/model_builder.h"

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

/// Plans and runs `model` on 1 and on 2 devices against the unpartitioned model (each keeping
/// `kept` nodes of `op`), then trains it (check_training).
void check_plans_and_training(const std::string& model, const std::string& op, int64_t kept);

/// Writes `b`'s model to `path` and imports it: returns the import's error message (checked to
/// be one line), or "imported".
std::string import_message(const samples::ModelBuilder& b, const std::string& path);

/// Ends `b`'s model with y = Relu(out) of `y_shape` (node "/out"), then import_message above.
std::string import_message(samples::ModelBuilder& b, const std::string& out,
                           const samples::Shape& y_shape, const std::string& path);

/// Checks that `what` (an error message) contains `needle`.
void check_contains(const std::string& what, const std::string& needle);

}  // namespace stagecraft::testing
