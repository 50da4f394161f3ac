#pragma once
/// \file
/// A backend that claims GPUs without having any, for the tests of where plan devices run.

#include <memory>
#include <span>
#include <string>

#include "runtime/core/backend.h"

namespace stagecraft::rt {

/// A CUDA-like backend on `gpus` GPUs: plan device d runs on GPU d mod gpus, as the CUDA backend
/// places them. It runs nothing (no kernels, no device contexts).
class FakeGpus final : public Backend {
 public:
  explicit FakeGpus(int gpus) : gpus_(gpus) {}
  std::string_view name() const override { return "cuda"; }
  DeviceKind kind() const override { return DeviceKind::kGpu; }
  std::span<const KernelEntry> table() const override { return {}; }
  std::unique_ptr<DeviceContext> make_device(int, int) const override { return nullptr; }
  Physical physical_device(int device) const override {
    return {device % gpus_, int64_t{80} << 30, "GPU " + std::to_string(device % gpus_) + " (fake)"};
  }

 private:
  int gpus_;
};

}  // namespace stagecraft::rt
