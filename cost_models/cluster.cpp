#include "cost_models/cluster.h"

#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "cost_models/device_spec.h"
#include "runtime/format/error.h"
#include "runtime/format/json_reader.h"

namespace stagecraft::cost {
namespace {

// Link latencies are what one NCCL point-to-point message costs beyond its bytes: a few
// microseconds over NVLink, a little more through an InfiniBand NIC.
constexpr double kNvlinkLatency = 3e-6;
constexpr double kInfinibandLatency = 5e-6;

// H100 datasheet: NVLink 900 GB/s per GPU, i.e. 450 GB/s in each direction, to any GPU of an
// HGX/DGX H100 through NVSwitch. DGX H100 user guide: eight ConnectX-7 adapters, 400 Gb/s NDR
// InfiniBand each, one per GPU (50 GB/s). H200 HGX boards use the same NVLink 4 and NICs.
constexpr ClusterSpec kHopperNode{8, {450e9, kNvlinkLatency}, {50e9, kInfinibandLatency}};

// A100 datasheet: NVLink 600 GB/s per GPU (300 GB/s each way) through NVSwitch. DGX A100 user
// guide: eight ConnectX-6 adapters for the compute network, 200 Gb/s HDR each (25 GB/s).
constexpr ClusterSpec kAmpereNode{8, {300e9, kNvlinkLatency}, {25e9, kInfinibandLatency}};

// V100 datasheet: NVLink 300 GB/s per GPU over six NVLink 2 links, 25 GB/s each way per link.
// In the DGX-1 hybrid cube-mesh, adjacent GPUs share one or two links, so one link is what
// every adjacent pair has. DGX-1: four 100 Gb/s EDR InfiniBand ports (12.5 GB/s each).
constexpr ClusterSpec kVoltaNode{8, {25e9, kNvlinkLatency}, {12.5e9, kInfinibandLatency}};

// CPU devices on one machine are ranks sharing memory: a copy reads and writes, so it gets
// about half of the preset's 20 GB/s; a hand-off through a mutex and condition variable costs
// a few microseconds. Between machines: 10 Gb/s Ethernet (1.25 GB/s), tens of microseconds
// per message over TCP.
constexpr ClusterSpec kCpuNode{8, {10e9, 5e-6}, {1.25e9, 50e-6}};

// Any other device: GPUs on PCIe Gen4 x16 (32 GB/s raw each way, about 25 GB/s achieved) and a
// 100 Gb/s network (12.5 GB/s).
constexpr ClusterSpec kPcieNode{8, {25e9, 10e-6}, {12.5e9, 10e-6}};

LinkSpec link_from_json(const JsonObject& top, std::string_view name) {
  JsonObject f = top.object(name, {"bandwidth", "latency_s"});
  return {f.positive_number("bandwidth"), f.positive_number("latency_s")};
}

}  // namespace

ClusterSpec default_cluster(std::string_view device_name) {
  if (device_name == "h100" || device_name == "h200") return kHopperNode;
  if (device_name == "a100-80g" || device_name == "a100-40g") return kAmpereNode;
  if (device_name == "v100-16g") return kVoltaNode;
  if (device_name == "cpu") return kCpuNode;
  return kPcieNode;
}

ClusterSpec cluster_spec_from_json(const nlohmann::json& object, const std::string& source) {
  JsonObject f =
      JsonValue(object, source)
          .object({"devices_per_node", "intra_node", "inter_node", "devices_per_processor"});
  ClusterSpec spec;
  JsonValue per_node = f.at("devices_per_node");
  if (per_node.positive_int64() > std::numeric_limits<int>::max()) {
    per_node.fail(fmt::format("is too large: {}", per_node.positive_int64()));
  }
  spec.devices_per_node = per_node.int32();
  spec.intra_node = link_from_json(f, "intra_node");
  spec.inter_node = link_from_json(f, "inter_node");
  // Optional: the cluster files written before devices could share a processor lack it.
  if (std::optional<JsonValue> shared = f.find("devices_per_processor")) {
    if (shared->positive_int64() > std::numeric_limits<int>::max())
      shared->fail(fmt::format("is too large: {}", shared->positive_int64()));
    spec.devices_per_processor = shared->int32();
  }
  return spec;
}

nlohmann::json to_json(const ClusterSpec& spec) {
  auto link = [](const LinkSpec& l) {
    return nlohmann::json{{"bandwidth", l.bandwidth}, {"latency_s", l.latency_s}};
  };
  nlohmann::json out{{"devices_per_node", spec.devices_per_node},
                     {"intra_node", link(spec.intra_node)},
                     {"inter_node", link(spec.inter_node)}};
  if (spec.devices_per_processor != 1) out["devices_per_processor"] = spec.devices_per_processor;
  return out;
}

ClusterSpec cluster_spec_from_name_or_file(const std::string& text) {
  if (device_preset(text)) return default_cluster(text);
  std::error_code ec;
  if (!std::filesystem::exists(text, ec)) {
    fail(ErrorKind::kUsage, "unknown cluster '{}': not a device preset ({}) and no such file", text,
         device_preset_names());
  }
  return cluster_spec_from_json(read_json_file(text), text);
}

int node_of(const ClusterSpec& spec, int device) {
  if (device < 0 || spec.devices_per_node <= 0) {
    fail(ErrorKind::kInternal, "node_of: device {} with {} devices per node", device,
         spec.devices_per_node);
  }
  return device / spec.devices_per_node;
}

double local_copy_seconds(const ClusterSpec& spec, double memory_bandwidth, double bytes) {
  if (bytes < 0 || !(memory_bandwidth > 0))
    fail(ErrorKind::kInternal, "local_copy_seconds: {} bytes at {} bytes/s", bytes,
         memory_bandwidth);
  return spec.intra_node.latency_s + 2 * bytes / memory_bandwidth;
}

double transfer_seconds(const ClusterSpec& spec, int src_device, int dst_device, double bytes) {
  if (bytes < 0) fail(ErrorKind::kInternal, "transfer_seconds: negative byte count {}", bytes);
  int src_node = node_of(spec, src_device);
  int dst_node = node_of(spec, dst_device);
  if (src_device == dst_device) return 0;
  const LinkSpec& link = src_node == dst_node ? spec.intra_node : spec.inter_node;
  return link.latency_s + bytes / link.bandwidth;
}

}  // namespace stagecraft::cost
