#pragma once
/// \file
/// How devices are connected: nodes of `devices_per_node` devices joined by a fast link
/// (NVLink, shared memory), and nodes joined by a network. Devices are numbered 0..N-1 and
/// filled node by node, so devices d and e share a node when d / devices_per_node equals
/// e / devices_per_node.

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "runtime/format/plan.h"

namespace stagecraft::cost {

/// One link and the topology are the plan format's types: the plan records the cluster it was
/// made for as the cost model saw it.
using LinkSpec = plan::LinkSpec;
using ClusterSpec = plan::ClusterSpec;

/// The usual topology of the device preset `device_name` (an 8-GPU HGX/DGX node for the GPUs,
/// shared memory for cpu), or a generic PCIe Gen4 node with a 100 Gb/s network for any other
/// name. The sources are cited in cluster.cpp.
ClusterSpec default_cluster(std::string_view device_name);

/// Reads a topology from a JSON object {devices_per_node, intra_node: {bandwidth, latency_s},
/// inter_node: {bandwidth, latency_s}, [devices_per_processor]}. Every field but
/// devices_per_processor (default 1: each device its own processor) is required; all are
/// positive; unknown fields are refused. Errors are `Error(kFormat)` naming `source` and the field
/// ("c.json: field 'intra_node.bandwidth' is missing").
ClusterSpec cluster_spec_from_json(const nlohmann::json& object, const std::string& source);

/// The JSON object `cluster_spec_from_json` reads (devices_per_processor only when not 1).
nlohmann::json to_json(const ClusterSpec& spec);

/// A device preset name (its default topology), or else the path of a JSON topology file.
/// Throws `Error(kUsage)` listing the presets when `text` is neither.
ClusterSpec cluster_spec_from_name_or_file(const std::string& text);

/// The node that holds `device`.
int node_of(const ClusterSpec& spec, int device);

/// Seconds to move `bytes` between two devices that share a processor: a copy in its memory
/// (read and write at `memory_bandwidth`, the device's) after the intra-node link's hand-off
/// latency. Throws `Error(kInternal)` on negative bytes or a bandwidth that is not positive.
double local_copy_seconds(const ClusterSpec& spec, double memory_bandwidth, double bytes);

/// Seconds to move `bytes` from `src_device` to `dst_device`: 0 on one device, otherwise the
/// link's latency plus bytes / bandwidth, over the intra-node link when both devices share a
/// node and the inter-node link otherwise. Throws `Error(kInternal)` on a negative device or
/// byte count.
double transfer_seconds(const ClusterSpec& spec, int src_device, int dst_device, double bytes);

}  // namespace stagecraft::cost
