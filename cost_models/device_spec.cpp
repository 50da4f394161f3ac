#include "cost_models/device_spec.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "runtime/format/error.h"
#include "runtime/format/json_reader.h"
#include "runtime/format/suggest.h"

namespace stagecraft::cost {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// Kernel launch plus tail on a GPU: the commonly measured 3-5 us of a CUDA launch.
constexpr double kGpuLaunchOverhead = 4e-6;

/// Large bf16 GEMMs on A100/H100 reach about 60-80% of the datasheet peak, whole training runs
/// less (published model FLOP utilisation is 40-60%); 0.6 sits between the two.
constexpr double kGpuEfficiency = 0.6;

std::vector<DeviceSpec> make_presets() {
  // Memory capacities are the datasheets' decimal gigabytes (10^9 bytes). The driver reports
  // a little more (80 GB H100: 79.6 GiB), so the difference is left for the CUDA context and
  // allocator fragmentation rather than planned into.
  return {
      // NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67 TFLOPS, BF16 Tensor
      // Core 1,979 TFLOPS with sparsity (989 dense), GPU memory 80 GB, bandwidth 3.35 TB/s.
      {"h100", 67e12, 989e12, 3.35e12, 80'000'000'000, kGpuLaunchOverhead, kGpuEfficiency},
      // NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: same compute as H100 SXM
      // (FP32 67 TFLOPS, BF16 989 dense), GPU memory 141 GB, bandwidth 4.8 TB/s.
      {"h200", 67e12, 989e12, 4.8e12, 141'000'000'000, kGpuLaunchOverhead, kGpuEfficiency},
      // NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: FP32 19.5 TFLOPS, BF16
      // Tensor Core 312 TFLOPS (dense), 80 GB HBM2e at 2,039 GB/s.
      {"a100-80g", 19.5e12, 312e12, 2.039e12, 80'000'000'000, kGpuLaunchOverhead, kGpuEfficiency},
      // Same datasheet, A100 40GB SXM column: same compute, 40 GB HBM2 at 1,555 GB/s.
      {"a100-40g", 19.5e12, 312e12, 1.555e12, 40'000'000'000, kGpuLaunchOverhead, kGpuEfficiency},
      // NVIDIA Tesla V100 datasheet, V100 SXM2 column: single precision 15.7 TFLOPS, tensor
      // performance 125 TFLOPS (fp16), 16 GB HBM2 at 900 GB/s.
      {"v100-16g", 15.7e12, 125e12, 900e9, 16'000'000'000, kGpuLaunchOverhead, kGpuEfficiency},
      // A modest 2-core x86 box (no vendor datasheet): 2 cores x 2.5 GHz x 32 fp32 FLOP/cycle
      // (two 8-wide AVX2 FMA units) = 160 GFLOP/s peak, of which oneDNN sustains about 100;
      // no faster 16-bit path without AMX; one DDR4-3200 channel is 25.6 GB/s, about 20
      // achievable; 16 GiB of RAM; about 2 us to dispatch a primitive.
      {"cpu", 100e9, 100e9, 20e9, static_cast<int64_t>(16 * kGiB), 2e-6, 0.5, DeviceKind::kCpu},
  };
}

}  // namespace

const std::vector<DeviceSpec>& device_presets() {
  static const std::vector<DeviceSpec> presets = make_presets();
  return presets;
}

std::string device_preset_names() {
  std::vector<std::string_view> names;
  for (const DeviceSpec& spec : device_presets()) names.push_back(spec.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::optional<DeviceSpec> device_preset(std::string_view name) {
  for (const DeviceSpec& spec : device_presets()) {
    if (spec.name == name) return spec;
  }
  return std::nullopt;
}

void validate(const DeviceSpec& spec) {
  auto check = [&](std::string_view field, double value) {
    if (!(value > 0))
      fail(ErrorKind::kUsage, "device '{}': {} must be positive, not {}", spec.name, field, value);
  };
  check("peak_flops_fp32", spec.peak_flops_fp32);
  check("peak_flops_fp16", spec.peak_flops_fp16);
  check("memory_bandwidth", spec.memory_bandwidth);
  check("memory_bytes", static_cast<double>(spec.memory_bytes));
  check("launch_overhead_s", spec.launch_overhead_s);
  check("efficiency", spec.efficiency);
  if (spec.efficiency > 1) {
    fail(ErrorKind::kUsage, "device '{}': efficiency must be at most 1, not {}", spec.name,
         spec.efficiency);
  }
}

DeviceSpec device_spec_from_json(const nlohmann::json& object, const std::string& source) {
  JsonObject f =
      JsonValue(object, source)
          .object({"name", "kind", "peak_flops_fp32", "peak_flops_fp16", "memory_bandwidth",
                   "memory_bytes", "launch_overhead_s", "efficiency"});
  DeviceSpec spec;
  spec.name = f.nonempty_string("name");
  spec.peak_flops_fp32 = f.positive_number("peak_flops_fp32");
  spec.peak_flops_fp16 = f.positive_number("peak_flops_fp16");
  spec.memory_bandwidth = f.positive_number("memory_bandwidth");
  spec.memory_bytes = f.positive_int64("memory_bytes");
  spec.launch_overhead_s = f.positive_number("launch_overhead_s");
  spec.efficiency = f.positive_number("efficiency", 1.0);
  if (auto kind = f.find("kind")) {
    const std::string name = kind->string();
    const std::optional<DeviceKind> found = find_device_kind(name);
    if (!found) kind->fail(fmt::format("is \"{}\"; it is \"cpu\" or \"gpu\"", name));
    spec.kind = *found;
  }
  return spec;
}

nlohmann::json to_json(const DeviceSpec& spec) {
  return {{"name", spec.name},
          {"kind", to_string(spec.kind)},
          {"peak_flops_fp32", spec.peak_flops_fp32},
          {"peak_flops_fp16", spec.peak_flops_fp16},
          {"memory_bandwidth", spec.memory_bandwidth},
          {"memory_bytes", spec.memory_bytes},
          {"launch_overhead_s", spec.launch_overhead_s},
          {"efficiency", spec.efficiency}};
}

DeviceSpec device_spec_from_name_or_file(const std::string& text) {
  if (auto preset = device_preset(text)) return *preset;
  std::error_code ec;
  if (!std::filesystem::exists(text, ec)) {
    std::vector<std::string_view> presets;
    for (const DeviceSpec& spec : device_presets()) presets.push_back(spec.name);
    fail(ErrorKind::kUsage, "unknown device '{}'{}: not a preset ({}) and no such file", text,
         did_you_mean(text, presets), device_preset_names());
  }
  return device_spec_from_json(read_json_file(text), text);
}

}  // namespace stagecraft::cost
