#pragma once
/// \file
/// The CUDA data family's shape ops (data_shape.cpp): Shape, Constant, ConstantOfShape and
/// Range, computed on the host and written to the device; data.cpp adds them to its table.

#include <span>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cuda {

std::span<const KernelEntry> data_shape_kernels();

}  // namespace stagecraft::rt::cuda
