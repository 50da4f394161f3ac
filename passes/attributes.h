#pragma once
/// \file
/// ONNX attribute builders for the nodes passes add to a graph (the loss, the gradient nodes).

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stagecraft::passes {

/// An INT attribute `name` = `value`.
inline onnx::AttributeProto int_attribute(std::string_view name, int64_t value) {
  onnx::AttributeProto a;
  a.set_name(std::string(name));
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(value);
  return a;
}

/// An INTS attribute `name` = `values`.
inline onnx::AttributeProto ints_attribute(std::string_view name,
                                           const std::vector<int64_t>& values) {
  onnx::AttributeProto a;
  a.set_name(std::string(name));
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a.add_ints(v);
  return a;
}

/// A FLOAT attribute `name` = `value`.
inline onnx::AttributeProto float_attribute(std::string_view name, float value) {
  onnx::AttributeProto a;
  a.set_name(std::string(name));
  a.set_type(onnx::AttributeProto::FLOAT);
  a.set_f(value);
  return a;
}

/// A STRING attribute `name` = `value`.
inline onnx::AttributeProto string_attribute(std::string_view name, const std::string& value) {
  onnx::AttributeProto a;
  a.set_name(std::string(name));
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(value);
  return a;
}

}  // namespace stagecraft::passes
