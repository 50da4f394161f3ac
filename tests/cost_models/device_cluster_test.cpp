// Device presets, cluster topologies and link times, and the validation of their JSON files.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cost_models/cluster.h"
#include "cost_models/device_spec.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::cost {
namespace {

const nlohmann::json kValidDevice = {
    {"name", "mygpu"},          {"peak_flops_fp32", 30e12},    {"peak_flops_fp16", 240e12},
    {"memory_bandwidth", 1e12}, {"memory_bytes", 24000000000}, {"launch_overhead_s", 5e-6},
    {"efficiency", 0.7}};

const nlohmann::json kValidCluster = {{"devices_per_node", 4},
                                      {"intra_node", {{"bandwidth", 100e9}, {"latency_s", 2e-6}}},
                                      {"inter_node", {{"bandwidth", 10e9}, {"latency_s", 20e-6}}}};

/// Writes `text` to a file in `dir` and returns its path.
std::string write_file(const testing::TempDir& dir, const std::string& name,
                       const std::string& text) {
  std::string path = dir.file(name);
  testing::write_bytes(path, text);
  return path;
}

/// The error `body` throws; fails the test when it throws none. Checks the message is one line.
template <typename Body>
Error error_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
    return e;
  }
  FAIL("no error thrown");
  return Error(ErrorKind::kInternal, "unreachable");
}

TEST_CASE("presets carry the datasheet numbers") {
  auto h100 = device_spec_from_name_or_file("h100");
  CHECK(h100.peak_flops_fp32 == 67e12);
  CHECK(h100.peak_flops_fp16 == 989e12);
  CHECK(h100.memory_bandwidth == 3.35e12);
  CHECK(h100.memory_bytes == 80'000'000'000);
  auto h200 = *device_preset("h200");
  CHECK(h200.peak_flops_fp16 == h100.peak_flops_fp16);
  CHECK(h200.memory_bandwidth == 4.8e12);
  CHECK(h200.memory_bytes == 141'000'000'000);
  auto a100 = *device_preset("a100-80g");
  CHECK(a100.peak_flops_fp32 == 19.5e12);
  CHECK(a100.peak_flops_fp16 == 312e12);
  CHECK(a100.memory_bandwidth == 2.039e12);
  auto a100_40 = *device_preset("a100-40g");
  CHECK(a100_40.memory_bandwidth == 1.555e12);
  CHECK(a100_40.memory_bytes == 40'000'000'000);
  auto v100 = *device_preset("v100-16g");
  CHECK(v100.peak_flops_fp32 == 15.7e12);
  CHECK(v100.peak_flops_fp16 == 125e12);
  CHECK(v100.memory_bandwidth == 900e9);
  auto cpu = *device_preset("cpu");
  CHECK(cpu.peak_flops_fp32 == 100e9);
  CHECK(cpu.memory_bandwidth == 20e9);
  CHECK(cpu.memory_bytes == int64_t{16} << 30);
  CHECK(cpu.launch_overhead_s == 2e-6);
  CHECK(cpu.kind == DeviceKind::kCpu);
  CHECK(v100.kind == DeviceKind::kGpu);
  CHECK(device_preset_names() == "h100, h200, a100-80g, a100-40g, v100-16g, cpu");
  for (const DeviceSpec& spec : device_presets()) {
    CAPTURE(spec.name);
    CHECK_NOTHROW(validate(spec));
    CHECK(spec.efficiency <= 1);
    CHECK(device_spec_from_json(to_json(spec), "round trip").memory_bytes == spec.memory_bytes);
    CHECK(device_spec_from_json(to_json(spec), "round trip").kind == spec.kind);
  }
}

TEST_CASE("a device file is read field by field") {
  testing::TempDir dir;
  auto spec = device_spec_from_name_or_file(write_file(dir, "gpu.json", kValidDevice.dump()));
  CHECK(spec.name == "mygpu");
  CHECK(spec.peak_flops_fp16 == 240e12);
  CHECK(spec.memory_bytes == 24'000'000'000);
  CHECK(spec.efficiency == 0.7);
  CHECK(spec.kind == DeviceKind::kGpu);  // the default when a file says nothing
  nlohmann::json cpu_file = kValidDevice;
  cpu_file["kind"] = "cpu";
  CHECK(device_spec_from_json(cpu_file, "c.json").kind == DeviceKind::kCpu);
  cpu_file["kind"] = "tpu";
  CHECK_THROWS_WITH_AS(device_spec_from_json(cpu_file, "c.json"),
                       "c.json: field 'kind' is \"tpu\"; it is \"cpu\" or \"gpu\"", Error);
  nlohmann::json written_as_float = kValidDevice;
  written_as_float["memory_bytes"] = 2.4e10;
  CHECK(device_spec_from_json(written_as_float, "f.json").memory_bytes == 24'000'000'000);
}

TEST_CASE("a bad device file is refused naming the file and the field") {
  testing::TempDir dir;
  auto refused = [&](const nlohmann::json& spec, const std::string& expected) {
    std::string path = write_file(dir, "h.json", spec.dump());
    Error e = error_of([&] { device_spec_from_name_or_file(path); });
    CHECK(e.kind() == ErrorKind::kFormat);
    CHECK(std::string(e.what()) == path + ": " + expected);
  };
  auto without = [](const char* field) {
    nlohmann::json spec = kValidDevice;
    spec.erase(field);
    return spec;
  };
  auto with = [](const char* field, nlohmann::json value) {
    nlohmann::json spec = kValidDevice;
    spec[field] = std::move(value);
    return spec;
  };
  refused(without("memory_bandwidth"), "field 'memory_bandwidth' is missing");
  refused(without("name"), "field 'name' is missing");
  refused(with("memory_bandwidth", -3), "field 'memory_bandwidth' must be positive, not -3");
  refused(with("peak_flops_fp32", 0), "field 'peak_flops_fp32' must be positive, not 0");
  refused(with("launch_overhead_s", "4us"),
          "field 'launch_overhead_s' must be a number, not string");
  refused(with("efficiency", 1.5), "field 'efficiency' must be at most 1, not 1.5");
  refused(with("memory_bytes", 1.5e3 + 0.25),
          "field 'memory_bytes' must be a whole number that fits in int64, not 1500.25");
  refused(with("memory_bytes", true), "field 'memory_bytes' must be a number, not boolean");
  refused(with("name", ""), "field 'name' must not be empty");
  refused(
      with("memory_bandwith", 1e12),
      "unknown field 'memory_bandwith' (did you mean 'memory_bandwidth'?); expected: name, kind, "
      "peak_flops_fp32, peak_flops_fp16, memory_bandwidth, memory_bytes, launch_overhead_s, "
      "efficiency");
  refused(nlohmann::json::array({1, 2}), "the file must be a JSON object, not array");

  std::string bad = write_file(dir, "bad.json", "{\"name\": \"x\",");
  Error e = error_of([&] { device_spec_from_name_or_file(bad); });
  CHECK(e.kind() == ErrorKind::kFormat);
  CHECK(std::string(e.what()).starts_with(bad + ": not valid JSON: parse error at line 1"));
}

TEST_CASE("an unknown device name lists the presets") {
  Error e = error_of([] { device_spec_from_name_or_file("h800"); });
  CHECK(e.kind() == ErrorKind::kUsage);
  CHECK(std::string(e.what()) ==
        "unknown device 'h800' (did you mean 'h100'?): not a preset (h100, h200, a100-80g, "
        "a100-40g, v100-16g, cpu) and no such file");
  CHECK(std::string(error_of([] { device_spec_from_name_or_file("tpu"); }).what()) ==
        "unknown device 'tpu': not a preset (h100, h200, a100-80g, a100-40g, v100-16g, cpu) and "
        "no such file");
  testing::TempDir dir;
  Error io = error_of([&] { device_spec_from_name_or_file(dir.path().string()); });
  CHECK(io.kind() == ErrorKind::kIo);
}

TEST_CASE("a device built in code is validated by the roofline's check") {
  DeviceSpec spec = *device_preset("h100");
  spec.memory_bandwidth = 0;
  CHECK_THROWS_WITH_AS(validate(spec), "device 'h100': memory_bandwidth must be positive, not 0",
                       Error);
}

TEST_CASE("default clusters per device kind") {
  auto hopper = default_cluster("h100");
  CHECK(hopper.devices_per_node == 8);
  CHECK(hopper.intra_node.bandwidth == 450e9);
  CHECK(hopper.inter_node.bandwidth == 50e9);
  CHECK(default_cluster("h200").intra_node.bandwidth == 450e9);
  CHECK(default_cluster("a100-40g").intra_node.bandwidth == 300e9);
  CHECK(default_cluster("a100-80g").inter_node.bandwidth == 25e9);
  CHECK(default_cluster("v100-16g").intra_node.bandwidth == 25e9);
  CHECK(default_cluster("cpu").intra_node.bandwidth == 10e9);
  CHECK(default_cluster("mygpu").intra_node.bandwidth == 25e9);  // PCIe Gen4 x16
  for (const DeviceSpec& spec : device_presets()) {
    auto cluster = default_cluster(spec.name);
    CHECK(cluster.intra_node.bandwidth > cluster.inter_node.bandwidth);
    CHECK(cluster.intra_node.latency_s > 0);
  }
  CHECK(cluster_spec_from_name_or_file("a100-80g").intra_node.bandwidth == 300e9);
}

TEST_CASE("link times: same device free, same node intra link, otherwise inter link") {
  ClusterSpec cluster{4, {100e9, 2e-6}, {10e9, 20e-6}};
  CHECK(transfer_seconds(cluster, 3, 3, 1e9) == 0);
  CHECK(transfer_seconds(cluster, 0, 3, 1e9) == doctest::Approx(2e-6 + 1e9 / 100e9));
  CHECK(transfer_seconds(cluster, 3, 4, 1e9) == doctest::Approx(20e-6 + 1e9 / 10e9));
  CHECK(transfer_seconds(cluster, 5, 1, 0) == doctest::Approx(20e-6));
  CHECK(node_of(cluster, 7) == 1);
  CHECK_THROWS_AS(transfer_seconds(cluster, -1, 0, 1), Error);
  CHECK_THROWS_AS(transfer_seconds(cluster, 0, 1, -1), Error);
  // 1 GiB of fp16 activations across an H100 node's NVLink: about 2.4 ms.
  CHECK(transfer_seconds(default_cluster("h100"), 0, 1, 1 << 30) ==
        doctest::Approx(2.389e-3).epsilon(0.01));
}

TEST_CASE("a cluster file is validated like a device file") {
  testing::TempDir dir;
  std::string good = write_file(dir, "c.json", kValidCluster.dump());
  auto cluster = cluster_spec_from_name_or_file(good);
  CHECK(cluster.devices_per_node == 4);
  CHECK(cluster.inter_node.latency_s == 20e-6);
  CHECK(cluster_spec_from_json(to_json(cluster), "again").intra_node.bandwidth == 100e9);

  auto refused = [&](const nlohmann::json& spec, const std::string& expected) {
    std::string path = write_file(dir, "c.json", spec.dump());
    Error e = error_of([&] { cluster_spec_from_name_or_file(path); });
    CHECK(e.kind() == ErrorKind::kFormat);
    CHECK(std::string(e.what()) == path + ": " + expected);
  };
  nlohmann::json spec = kValidCluster;
  spec["intra_node"].erase("bandwidth");
  refused(spec, "field 'intra_node.bandwidth' is missing");
  spec = kValidCluster;
  spec["inter_node"]["latency_s"] = -1e-6;
  refused(spec, "field 'inter_node.latency_s' must be positive, not -1e-06");
  spec = kValidCluster;
  spec["devices_per_node"] = 0;
  refused(spec, "field 'devices_per_node' must be positive, not 0");
  spec = kValidCluster;
  spec["devices_per_node"] = 2.5;
  refused(spec, "field 'devices_per_node' must be a whole number that fits in int64, not 2.5");
  spec = kValidCluster;
  spec["inter_node"] = 5;
  refused(spec, "field 'inter_node' must be a JSON object, not number");
  spec = kValidCluster;
  spec.erase("inter_node");
  refused(spec, "field 'inter_node' is missing");

  Error e = error_of([] { cluster_spec_from_name_or_file("dgx"); });
  CHECK(e.kind() == ErrorKind::kUsage);
  CHECK(std::string(e.what()).find("h100, h200, a100-80g, a100-40g, v100-16g, cpu") !=
        std::string::npos);
}

}  // namespace
}  // namespace stagecraft::cost
