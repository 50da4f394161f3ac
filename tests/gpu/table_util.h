#pragma once
/// \file
/// What the CUDA table tests share: finding an op in a dispatch table and setting a node's
/// attributes. Inline, so a build without the CUDA backend (where most of their bodies are
/// compiled out) has nothing unused.

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::gpu_test {

inline const KernelEntry* find_entry(std::span<const KernelEntry> table, std::string_view op) {
  for (const KernelEntry& e : table)
    if (e.op_type == op) return &e;
  return nullptr;
}

inline void set_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

inline void set_ints(onnx::NodeProto& node, const std::string& name,
                     const std::vector<int64_t>& values) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

inline void set_string(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(value);
}

}  // namespace stagecraft::rt::gpu_test
