#pragma once
/// \file
/// A .npy file's header alone (implemented with read_npy in tensor_io.cpp): what a reader of
/// parts of a large array needs (stagerun --data and --tokens read one batch's rows at a time).

#include <cstdint>
#include <string>

#include "runtime/core/tensor.h"

namespace stagecraft::rt {

/// The array a .npy file holds: its dtype, shape and where its data starts (bytes from the
/// file's start).
struct NpyArray {
  DType dtype = DType::kUndefined;
  Shape shape;
  int64_t data_offset = 0;
};

/// Reads and checks a .npy file's header as `read_npy` does (every refusal the same, the file
/// checked to hold the whole array) without reading its data.
NpyArray read_npy_header(const std::string& path);

}  // namespace stagecraft::rt
