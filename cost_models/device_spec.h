#pragma once
/// \file
/// What the cost models know about one device: peak arithmetic per precision, memory bandwidth
/// and capacity, kernel launch overhead and the fraction of peak matrix products reach.
/// Built-in presets cover the common accelerators; any other device is a small JSON file.

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/vocabulary.h"

namespace stagecraft::cost {

/// One device. Every number is positive; `efficiency` is in (0, 1].
struct DeviceSpec {
  std::string name;
  double peak_flops_fp32 = 0;    ///< Dense fp32 FLOP/s without tensor cores.
  double peak_flops_fp16 = 0;    ///< Dense 16-bit (bf16/fp16) tensor-core FLOP/s, no sparsity.
  double memory_bandwidth = 0;   ///< Device memory bytes/s.
  int64_t memory_bytes = 0;      ///< Device memory capacity in bytes.
  double launch_overhead_s = 0;  ///< Fixed cost of one kernel (launch and tail), seconds.
  /// Achievable fraction of peak for matrix products and convolutions (large GEMMs reach
  /// 60-80% of the datasheet peak). A calibration knob until measured profiles replace it.
  double efficiency = 0;
  DeviceKind kind = DeviceKind::kGpu;  ///< The kind of backend that runs it.
};

/// The built-in presets, in a fixed order: h100, h200, a100-80g, a100-40g, v100-16g, cpu.
const std::vector<DeviceSpec>& device_presets();

/// The names of the presets, comma-separated, for messages ("h100, h200, ...").
std::string device_preset_names();

/// The preset called `name`, or nullopt.
std::optional<DeviceSpec> device_preset(std::string_view name);

/// Throws `Error(kUsage)` naming the device and the field when a number is not positive (or
/// `efficiency` is above 1): a zero bandwidth would turn every time into infinity.
void validate(const DeviceSpec& spec);

/// Reads a device from a JSON object {name, kind, peak_flops_fp32, peak_flops_fp16,
/// memory_bandwidth, memory_bytes, launch_overhead_s, efficiency}. Every field but `kind` ("cpu"
/// or "gpu", default "gpu") is required and every number positive; unknown fields are refused.
/// Errors are `Error(kFormat)` naming `source` (the file) and the field: "h.json: field
/// 'memory_bandwidth' is missing".
DeviceSpec device_spec_from_json(const nlohmann::json& object, const std::string& source);

/// The JSON object `device_spec_from_json` reads.
nlohmann::json to_json(const DeviceSpec& spec);

/// A preset name, or else the path of a JSON device file (a preset name wins over a file of the
/// same name). Throws `Error(kUsage)` listing the presets when `text` is neither.
DeviceSpec device_spec_from_name_or_file(const std::string& text);

}  // namespace stagecraft::cost
