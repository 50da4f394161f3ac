#pragma once
/// \file
/// What the CUDA table tests share: checking that the CUDA backend's table covers CPU families
/// and that both backends answer signatures alike, finding an op in a dispatch table and setting
/// a node's attributes. Inline, so a build without the CUDA backend (where most of their bodies
/// are compiled out) has nothing unused.

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/kernel.h"

namespace stagecraft::rt::gpu_test {

inline const KernelEntry* find_entry(std::span<const KernelEntry> table, std::string_view op) {
  for (const KernelEntry& e : table)
    if (e.op_type == op) return &e;
  return nullptr;
}

/// Checks that every op of the CPU's `families` has a kernel in `cuda`'s table with the same
/// contract flag (requires the kernel); returns how many ops the families hold.
inline int check_covers(const Backend& cuda,
                        std::initializer_list<std::span<const KernelEntry>> families) {
  int ops = 0;
  for (const auto& family : families)
    for (const KernelEntry& cpu_entry : family) {
      CAPTURE(cpu_entry.op_type);
      const KernelEntry* entry = find_entry(cuda.table(), cpu_entry.op_type);
      REQUIRE(entry != nullptr);
      CHECK(entry->writes_every_output == cpu_entry.writes_every_output);
      ++ops;
    }
  return ops;
}

/// Checks that the CPU backend and `cuda` both accept every one of `signatures`.
inline void check_accepted_alike(const Backend& cuda, std::span<const OpSignature> signatures) {
  for (const OpSignature& s : signatures) {
    CAPTURE(s.op_type);
    CHECK(cpu_backend().check(s).empty());
    CHECK(cuda.check(s).empty());
  }
}

/// Checks that `cuda` refuses every one of `signatures`, with the CPU backend's message.
inline void check_refused_alike(const Backend& cuda, std::span<const OpSignature> signatures) {
  for (const OpSignature& s : signatures) {
    CAPTURE(s.op_type);
    CHECK_FALSE(cuda.check(s).empty());
    CHECK(cuda.check(s) == cpu_backend().check(s));
  }
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
