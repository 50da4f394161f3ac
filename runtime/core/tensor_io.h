#pragma once
/// \file
/// Tensors in and out of files: ONNX `TensorProto` (initializers, `.pb` test data) and NumPy
/// `.npy` (version 1-3, little-endian, C order).

#include <onnx/onnx_pb.h>

#include <string>

#include "runtime/core/tensor.h"

namespace stagecraft::rt {

/// The tensor held by `proto` (raw_data or the typed fields; bool, int8/16, uint8/16 and
/// float16 from int32_data as ONNX stores them). External data is refused here: a plan's stage
/// files read theirs through runtime/core/external_weights.h. Errors name `what`.
Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& what);

/// Reads a serialized `TensorProto` file (ONNX's test_data_set_N/input_K.pb).
Tensor read_tensor_pb(const std::string& path, std::string* name = nullptr);

/// Reads a .npy file. Throws `Error(kFormat)` naming the file for a bad header, a big-endian or
/// Fortran-order array, a dtype we do not know, or a file shorter than its header says.
Tensor read_npy(const std::string& path);

/// Writes a .npy file (version 1.0) through a temporary file renamed into place.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace stagecraft::rt
