// The plan format: JSON round trip, strict reading, the validator's refusals (each naming the
// field), file hashes and load_plan's checks of the stage files.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string>

#include "runtime/format/error.h"
#include "runtime/format/plan.h"
#include "tests/plan_format/sample_plan.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

using testing::sample_plan;

/// Runs `body`, which must throw an Error of `kind` whose message contains `expected`.
template <typename Body>
void check_error(Body&& body, ErrorKind kind, const std::string& expected) {
  try {
    body();
    FAIL("no error; expected: ", expected);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == kind);
    CHECK(std::string(e.what()).find(expected) != std::string::npos);
  }
}

/// validate_plan must refuse `plan` with a kPlan error containing `expected`.
void check_refused(const Plan& plan, const std::string& expected) {
  check_error([&] { validate_plan(plan, "p/plan.json"); }, ErrorKind::kPlan,
              "p/plan.json: field '" + expected);
}

nlohmann::json json_of(const Plan& plan) { return nlohmann::json::parse(to_json(plan).dump()); }

TEST_CASE("to_json then plan_from_json gives the same plan") {
  for (const char* schedule : {"1f1b", "interleaved", "inference"}) {
    Plan plan = sample_plan(schedule, 2, std::string(schedule) == "interleaved" ? 2 : 1, 4);
    plan.stages[1].file_hash = "fnv1a64:00000000000000ff";
    validate_plan(plan, "sample");
    Plan back = plan_from_json(json_of(plan), "sample");
    CHECK(to_json(back) == to_json(plan));
    CHECK(back.stages[1].inputs[0].peer_stage == 0);
    CHECK(back.stages[0].outputs[0].peer_stages == std::vector<int>{1});
    CHECK(back.stages.back().outputs.back().graph_output);
    CHECK(back.device.memory_bytes == plan.device.memory_bytes);
    CHECK(back.cluster.inter_node.latency_s == plan.cluster.inter_node.latency_s);
    CHECK(back.stages[0].backward_weight_ms == plan.stages[0].backward_weight_ms);
    CHECK(back.predicted.split_after == plan.predicted.split_after);
    CHECK(back.stages[1].memory.total() == plan.stages[1].memory.total());
  }
}

TEST_CASE("plan.json lists a stage's memory as parts, and one peak per device with its parts") {
  Plan plan = sample_plan("zb-h1", 3, 1, 4);
  nlohmann::ordered_json json = to_json(plan);
  CHECK(json.begin().key() == "format_version");
  CHECK(json["format_version"] == kPlanFormatVersion);
  const auto& memory = json["stages"][0]["memory"];
  std::vector<std::string> keys;
  for (const auto& item : memory.items()) keys.push_back(item.key());
  CHECK(keys == std::vector<std::string>{"weights", "gradients", "optimizer", "activations",
                                         "temporary", "communication"});
  REQUIRE(json["device_memory"].size() == 3);
  for (int d = 0; d < 3; ++d) {
    const auto& device = json["device_memory"][d];
    CAPTURE(d);
    int64_t sum = 0;
    for (const auto& part : device["parts"].items()) sum += part.value().get<int64_t>();
    CHECK(device["peak_bytes"] == sum);
    CHECK(device["peak_bytes"] == json["predicted"]["device_peak_bytes"][d]);
    CHECK(device["peak_bytes"] ==
          *std::max_element(device["bytes"].begin(), device["bytes"].end()));
    CHECK(device["parts"]["weights"] == plan.stages[d].memory.weights);
    CHECK(device["in_flight"].get<int64_t>() >= 1);
  }
  int64_t largest = 0;
  for (const auto& device : json["device_memory"])
    largest = std::max(largest, device["peak_bytes"].get<int64_t>());
  CHECK(json["predicted"]["peak_memory_bytes"] == largest);
}

TEST_CASE("plan_from_json names a missing or mistyped field") {
  nlohmann::json json = json_of(sample_plan());
  auto refused = [](nlohmann::json changed, const std::string& expected) {
    check_error([&] { plan_from_json(changed, "plan.json"); }, ErrorKind::kFormat, expected);
  };
  nlohmann::json missing = json;
  missing["stages"][1].erase("device");
  refused(missing, "plan.json: field 'stages[1].device' is missing");
  nlohmann::json mistyped = json;
  mistyped["stages"][1]["device"] = "one";
  refused(mistyped, "plan.json: field 'stages[1].device' must be a number, not string");
  nlohmann::json fractional = json;
  fractional["devices"] = 2.5;
  refused(fractional, "field 'devices' must be a whole number that fits in int32, not 2.5");
  nlohmann::json shape = json;
  shape["stages"][1]["inputs"][0]["shape"][1] = "16";
  refused(shape, "field 'stages[1].inputs[0].shape[1]' must be a number, not string");
  nlohmann::json unknown = json;
  unknown["stages"][0]["memory"]["weigths"] = 1;
  refused(unknown,
          "unknown field 'stages[0].memory.weigths' (did you mean 'weights'?); expected: weights, "
          "gradients, ");
  nlohmann::json total = json;
  total["stages"][0]["memory"]["total"] = 1;
  refused(total, "unknown field 'stages[0].memory.total'");
  nlohmann::json part = json;
  part["device_memory"][1]["parts"].erase("arena");
  refused(part, "plan.json: field 'device_memory[1].parts.arena' is missing");
  auto named = [&](const char* field, const char* value, const std::string& expected) {
    nlohmann::json changed = json;
    changed[field] = value;
    refused(changed, expected);
  };
  named("schedule", "pipedream",
        "plan.json: field 'schedule' is 'pipedream'; valid: gpipe, 1f1b, interleaved, zb-h1, "
        "zb-v, dualpipev, inference");
  named("objective", "fast", "field 'objective' is 'fast'; valid: speed, memory");
  named("precision", "fp8", "field 'precision' is 'fp8'; valid: fp32, mixed");
  named("optimizer", "lion", "field 'optimizer' is 'lion'; valid: none, sgd, ");
  nlohmann::json not_bool = json;
  not_bool["training"] = 1;
  refused(not_bool, "field 'training' must be a boolean, not number");
  refused(nlohmann::json::array(), "plan.json: the file must be a JSON object, not array");
}

TEST_CASE("another format version is unsupported and names both versions") {
  nlohmann::json json = json_of(sample_plan());
  json["format_version"] = kPlanFormatVersion + 1;
  json["stages"] = "whatever a newer version keeps here";
  std::string expected = "plan.json: field 'format_version' is " +
                         std::to_string(kPlanFormatVersion + 1) + "; this build reads version " +
                         std::to_string(kPlanFormatVersion);
  check_error([&] { plan_from_json(json, "plan.json"); }, ErrorKind::kUnsupported, expected);
  Plan plan = sample_plan();
  plan.format_version = 0;
  check_error([&] { validate_plan(plan, "plan.json"); }, ErrorKind::kUnsupported,
              "field 'format_version' is 0");
}

TEST_CASE("a plan of format 5 or older is refused with one line that says to re-run stagec") {
  for (int version : {1, 2, 3, 4, 5}) {
    nlohmann::json json = json_of(sample_plan());
    json["format_version"] = version;
    json["stages"][0].erase("backward_input_ms");  // what an older stagec did not write
    json["device_spec"] = {{"name", "h100"}};
    check_error([&] { plan_from_json(json, "old/plan.json"); }, ErrorKind::kUnsupported,
                fmt::format("old/plan.json: field 'format_version' is {}; this build reads "
                            "version {} (re-run stagec to write the plan again)",
                            version, kPlanFormatVersion));
  }
}

TEST_CASE("check_fits refuses a plan whose predicted peak exceeds the machine's memory") {
  Plan plan = sample_plan();
  plan.predicted.device_peak_bytes = {1000, 5000};
  CHECK_NOTHROW(check_fits(plan, 5000, "this machine", "p/plan.json"));
  check_error([&] { check_fits(plan, 4999, "this machine's physical memory", "p/plan.json"); },
              ErrorKind::kPlan,
              "p/plan.json: device 1 is predicted to peak at 5000 bytes, more than the 4999 bytes "
              "of this machine's physical memory (the plan was made for test with 1000000000 "
              "bytes per device)");
}

TEST_CASE("validate_plan checks the device, the cluster and each stage's B, W and optimizer") {
  Plan plan = sample_plan();
  SUBCASE("device kind") {  // read as the vocabulary's DeviceKind: refused when read
    nlohmann::json json = nlohmann::json::parse(to_json(plan).dump());
    json["device"]["kind"] = "tpu";
    CHECK_THROWS_WITH_AS(plan_from_json(json, "plan.json"),
                         doctest::Contains("device.kind' is 'tpu'; valid: cpu, gpu"), Error);
  }
  SUBCASE("device capacity") {
    plan.device.memory_bytes = 0;
    check_refused(plan, "device.memory_bytes' is 0; it must be >= 1");
  }
  SUBCASE("cluster bandwidth") {
    plan.cluster.inter_node.bandwidth = 0;
    check_refused(plan, "cluster.inter_node.bandwidth' is 0; it must be > 0");
  }
  SUBCASE("B + W is the backward") {
    plan.stages[1].backward_weight_ms = 3;
    check_refused(plan,
                  "stages[1].bwd_ms' is 2, but backward_input_ms + backward_weight_ms is 1 "
                  "+ 3 = 4");
  }
  SUBCASE("no optimizer step in inference") {
    Plan inference = sample_plan("inference");
    inference.stages[0].optimizer_ms = 1;
    check_refused(inference,
                  "stages[0].optimizer_ms' is 1, but an inference plan has no optimizer");
  }
}

TEST_CASE("a zb-v plan holds stages i and 2P-1-i on device i, and nothing else") {
  Plan plan = sample_plan("zb-v", 2, 2, 4);
  CHECK(plan.stages[2].device == 1);
  CHECK(plan.stages[3].device == 0);
  CHECK_NOTHROW(validate_plan(plan, "plan.json"));
  plan.stages[3].device = 1;
  plan.stages[2].device = 0;
  check_refused(plan,
                "stages[2].device' is 0, but stage 2 belongs on device 1 ('zb-v' on 2 "
                "devices)");
}

TEST_CASE("a dualpipev plan holds zb-v's V and at least 2P microbatches") {
  Plan plan = sample_plan("dualpipev", 2, 2, 4);
  CHECK(plan.stages[2].device == 1);
  CHECK(plan.stages[3].device == 0);
  CHECK_NOTHROW(validate_plan(plan, "plan.json"));
  Plan few = sample_plan("dualpipev", 2, 2, 4);
  few.microbatches = 3;
  few.batch = 6;
  check_refused(few,
                "microbatches' is 3, but schedule 'dualpipev' needs at least twice the 2 devices");
  plan.stages[3].device = 1;
  plan.stages[2].device = 0;
  check_refused(plan,
                "stages[2].device' is 0, but stage 2 belongs on device 1 ('dualpipev' on 2 "
                "devices)");
}

TEST_CASE("validate_plan refuses broken cross references naming the field") {
  Plan plan = sample_plan();
  SUBCASE("input whose producer lacks that output") {
    plan.stages[0].outputs.erase(plan.stages[0].outputs.begin());
    check_refused(
        plan, "stages[1].inputs[0]' reads 'act0' from stage 0, whose outputs do not include it");
  }
  SUBCASE("shape mismatch") {
    plan.stages[1].inputs[0].shape = {2, 8};
    check_refused(plan, "stages[1].inputs[0].shape' is [2,8], but stage 0 writes 'act0' as [2,16]");
  }
  SUBCASE("dtype mismatch") {
    plan.stages[1].inputs[0].dtype = "float16";
    check_refused(plan,
                  "stages[1].inputs[0].dtype' is float16, but stage 0 writes 'act0' as float32");
  }
  SUBCASE("producer does not list the reader") {
    plan.stages[0].outputs[0].peer_stages.clear();
    plan.stages[0].outputs[0].graph_output = true;
    check_refused(
        plan, "stages[1].inputs[0]' reads 'act0' from stage 0, whose output does not list stage 1");
  }
  SUBCASE("reader lacks the input") {
    plan.stages[1].inputs.erase(plan.stages[1].inputs.begin());
    check_refused(
        plan,
        "stages[0].outputs[0].peer_stages[0]' names stage 1, but stage 1 has no input 'act0'");
  }
  SUBCASE("output read by nobody") {
    plan.stages[1].outputs[0].graph_output = false;
    check_refused(plan,
                  "stages[1].outputs[0]' ('loss') is read by no stage and is not a graph output");
  }
  SUBCASE("input from a later stage") {
    plan.stages[0].inputs[0].peer_stage = 1;
    check_refused(plan, "stages[0].inputs[0].peer_stage' is 1");
  }
  SUBCASE("node in two stages") {
    plan.stages[1].nodes.push_back("s0_a");
    check_refused(
        plan,
        "stages[1].nodes[2]' names node 's0_a', which is already in stage 0 (stages[0].nodes[0])");
  }
  SUBCASE("empty stage") {
    plan.stages[1].nodes.clear();
    check_refused(plan, "stages[1].nodes' is empty");
  }
  SUBCASE("placement: not one rank per device, a rank out of range, a rank twice") {
    plan.placement = {0};
    check_refused(plan, "placement' has 1 ranks for 2 devices (1 replicas x 2)");
    plan.placement = {0, 2};
    check_refused(plan, "placement[1]' is rank 2; the ranks are 0 to 1");
    plan.placement = {1, 1};
    check_refused(plan, "placement[1]' is rank 1, which runs another device too");
    plan.placement = {1, 0};
    CHECK_NOTHROW(validate_plan(plan, "plan.json"));
  }
  SUBCASE("device out of range") {
    plan.stages[1].device = 5;
    check_refused(plan, "stages[1].device' is 5, but the plan has 2 devices (0..1)");
  }
  SUBCASE("stages not round-robin") {
    plan.devices = 1;
    plan.placement = {0};
    plan.chunks = 2;
    plan.schedule = ScheduleKind::kInterleaved;
    plan.stages[1].chunk = 1;
    check_refused(plan, "stages[1].device' is 1, but the plan has 1 device (0..0)");
    plan.stages[1].device = 0;
    plan.stages[0].chunk = 1;
    check_refused(plan, "stages[0].chunk' is 1, but stage 0 is chunk 0");
  }
  SUBCASE("batch is not microbatches x microbatch_size") {
    plan.batch = 10;
    check_refused(plan, "batch' is 10, but microbatches x microbatch_size is 4 x 2 = 8");
  }
  SUBCASE("stage count is not devices x chunks") {
    plan.stages.pop_back();
    check_refused(plan, "stages' has 1 stage, but devices x chunks is 2 x 1 = 2");
  }
  SUBCASE("stage index out of order") {
    plan.stages[1].index = 3;
    check_refused(plan, "stages[1].index' is 3");
  }
  SUBCASE("pipeline counts below one") {
    plan.microbatches = 0;
    check_refused(plan, "microbatches' is 0; it must be >= 1");
  }
  SUBCASE("chunks without the interleaved schedule") {
    plan.chunks = 2;
    check_refused(plan, "chunks' is 2, but schedule '1f1b' runs 1 chunk per device");
  }
  SUBCASE("zb-v with one chunk") {
    plan.schedule = ScheduleKind::kZBV;
    check_refused(plan, "chunks' is 1, but schedule 'zb-v' runs 2 chunks per device");
  }
  SUBCASE("inference schedule with training") {
    plan.schedule = ScheduleKind::kInference;
    check_refused(plan, "training' is true, but the schedule is 'inference'");
  }
  SUBCASE("negative numbers") {
    plan.stages[0].fwd_ms = -1;
    check_refused(plan, "stages[0].fwd_ms' is -1; it must be >= 0");
    plan.stages[0].fwd_ms = 1;
    plan.stages[1].memory.activations = -4;
    check_refused(plan, "stages[1].memory.activations' is -4");
    plan.stages[1].memory.activations = 4;
    plan.predicted.bubble_fraction = 1.5;
    check_refused(plan, "predicted.bubble_fraction' is 1.5");
  }
  SUBCASE("arena tensor whose end would wrap past 2^63") {
    plan.stages[0].arena_bytes = 4096;
    plan.stages[0].arena = {{"t", std::numeric_limits<int64_t>::max() - 63, 128}};
    check_refused(plan,
                  "stages[0].arena.tensors[0]' places 't' at offset 9223372036854775744 "
                  "(128 bytes), outside the 4096-byte arena");
  }
  SUBCASE("stage file outside the plan directory") {
    plan.stages[0].file = "../stage_0.onnx";
    check_refused(plan, "stages[0].file' is '../stage_0.onnx'");
  }
  SUBCASE("malformed hash") {
    plan.stages[0].file_hash = "md5:abc";
    check_refused(plan, "stages[0].file_hash' is 'md5:abc'");
  }
  SUBCASE("op in an unknown stage or node") {
    plan.ops[0].stage = 7;
    check_refused(plan, "ops[0].stage' is 7, but the plan has 2 stages");
    plan.ops[0].stage = 1;
    check_refused(plan, "ops[0].stage' is 1, but node 's0_a' is in stage 0");
    plan.ops[0].name = "nobody";
    check_refused(plan, "ops[0].name' is 'nobody', a node no stage lists");
  }
  SUBCASE("prediction per device") {
    plan.baseline_uniform.device_peak_bytes = {1, 2, 3};
    check_refused(plan,
                  "baseline_uniform.device_peak_bytes' has 3 entries, but the plan has 2 devices");
  }
  SUBCASE("one memory figure per device: the parts add up to it, and the prediction is it") {
    plan.device_memory[1].parts.activations += 1;
    check_refused(
        plan, fmt::format("device_memory[1].peak_bytes' is {}, but its parts add up to {}",
                          plan.device_memory[1].peak_bytes, plan.device_memory[1].peak_bytes + 1));
    plan.device_memory[1].peak_bytes += 1;
    check_refused(
        plan, fmt::format("predicted.device_peak_bytes[1]' is {}, but "
                          "device_memory[1].peak_bytes is {}",
                          plan.predicted.device_peak_bytes[1], plan.device_memory[1].peak_bytes));
    plan.predicted.device_peak_bytes[1] += 1;
    check_refused(
        plan, fmt::format("device_memory[1].bytes' reach {} at most, but peak_bytes is {}",
                          plan.device_memory[1].peak_bytes - 1, plan.device_memory[1].peak_bytes));
  }
  SUBCASE("a device's weights are its stages'") {
    plan.device_memory[0].parts.weights += 8;
    plan.device_memory[0].parts.activations -= 8;
    check_refused(plan,
                  fmt::format("device_memory[0].parts.weights' is {}, but the device's "
                              "stages hold {} together",
                              plan.stages[0].memory.weights + 8, plan.stages[0].memory.weights));
  }
  SUBCASE("a device entry for every device") {
    plan.device_memory.pop_back();
    check_refused(plan, "device_memory' has 1 entry, but the plan has 2 devices");
  }
}

TEST_CASE("file_hash is FNV-1a 64 over the bytes") {
  testing::TempDir dir;
  testing::write_bytes(dir.file("empty"), "");
  testing::write_bytes(dir.file("a"), "a");
  CHECK(file_hash(dir.file("empty")) == "fnv1a64:cbf29ce484222325");
  CHECK(file_hash(dir.file("a")) == "fnv1a64:af63dc4c8601ec8c");
  // Past one read chunk (1 MiB) the hash goes on where the last chunk ended.
  std::string big(3 << 20, 'x');
  testing::write_bytes(dir.file("big"), big);
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : big) hash = (hash ^ c) * 0x100000001b3ULL;
  CHECK(file_hash(dir.file("big")) == fmt::format("fnv1a64:{:016x}", hash));
  check_error([&] { file_hash(dir.file("none")); }, ErrorKind::kIo, "none: cannot open");
}

TEST_CASE("load_plan reads a plan directory and checks its stage files") {
  testing::TempDir dir;
  Plan written = testing::write_plan_dir(sample_plan(), dir.file("plan"));
  Plan loaded = load_plan(dir.file("plan"));
  CHECK(to_json(loaded) == to_json(written));
  CHECK(loaded.stages[1].file_hash.starts_with("fnv1a64:"));

  SUBCASE("hash mismatch") {
    testing::write_bytes(dir.file("plan/stage_1.onnx"), "edited");
    check_error([&] { load_plan(dir.file("plan")); }, ErrorKind::kPlan,
                "plan/stage_1.onnx: hash " + file_hash(dir.file("plan/stage_1.onnx")) +
                    " does not match plan.json's " + written.stages[1].file_hash);
  }
  SUBCASE("missing stage file") {
    std::filesystem::remove(dir.file("plan/stage_0.onnx"));
    check_error([&] { load_plan(dir.file("plan")); }, ErrorKind::kIo,
                "plan/stage_0.onnx: is missing (named by plan.json's stages[0].file)");
  }
  SUBCASE("no hash recorded: only existence is checked") {
    Plan dry = sample_plan();
    testing::write_plan_dir(dry, dir.file("dry"));
    dry.stages[0].file_hash.clear();
    testing::write_bytes(dir.file("dry/plan.json"), plan_json_text(to_json(dry)));
    testing::write_bytes(dir.file("dry/stage_0.onnx"), "anything");
    CHECK(load_plan(dir.file("dry")).stages[0].file_hash.empty());
  }
  SUBCASE("missing plan.json") {
    std::filesystem::remove(dir.file("plan/plan.json"));
    check_error([&] { load_plan(dir.file("plan")); }, ErrorKind::kIo,
                "plan/plan.json: cannot open (No such file or directory)");
  }
  SUBCASE("not a directory") {
    check_error([&] { load_plan(dir.file("nowhere")); }, ErrorKind::kIo,
                "nowhere: no such plan directory");
  }
  SUBCASE("bad JSON gives the position") {
    testing::write_bytes(dir.file("plan/plan.json"), "{\n  \"format_version\": 1,\n  oops\n}");
    check_error([&] { load_plan(dir.file("plan")); }, ErrorKind::kFormat,
                "plan/plan.json: not valid JSON: parse error at line 3, column 3");
  }
  SUBCASE("validation names the file") {
    testing::edit_file(dir.file("plan/plan.json"), "\"batch\": 8", "\"batch\": 9");
    check_error([&] { load_plan(dir.file("plan")); }, ErrorKind::kPlan,
                "plan/plan.json: field 'batch' is 9");
  }
}

}  // namespace
}  // namespace stagecraft::plan
