// Issue 16: the tools' JSON outputs are JSON Lines carrying their format_version, and the JSON
// Schema files under docs/schemas/ describe them. Real outputs (stagec --info and --list-nodes,
// stagedump --json and --trace, stagerun --json and --trace, on training and inference plans of
// the samples) are validated against the schemas here.
//
// Debian packages no C++ JSON Schema validator (apt: python3-jsonschema and node's ajv only), so
// this file has a minimal one for the subset of draft 2020-12 the schemas use: type, properties,
// required, additionalProperties (false or a schema), items, enum, const, minimum, minItems,
// oneOf, $ref to "#/..." and $defs; title, description, $schema and $id are annotations. Any
// other keyword in a schema is refused, so a schema cannot lean on a keyword nothing checks.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/cli/run_command.h"
#include "tests/test_util.h"
#include "tools/json_formats.h"

namespace stagecraft {
namespace {

using json = nlohmann::json;

/// Validates instances against one schema document (the subset above). `errors` lists every
/// failure as "PATH: what".
class SchemaValidator {
 public:
  explicit SchemaValidator(json schema) : root_(std::move(schema)) {}

  std::vector<std::string> errors(const json& instance) const {
    std::vector<std::string> out;
    check(instance, root_, "$", out);
    return out;
  }

 private:
  static bool has_type(const json& value, const std::string& type) {
    if (type == "object") return value.is_object();
    if (type == "array") return value.is_array();
    if (type == "string") return value.is_string();
    if (type == "boolean") return value.is_boolean();
    if (type == "null") return value.is_null();
    if (type == "number") return value.is_number();
    if (type == "integer")
      return value.is_number_integer() ||
             (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
    throw std::runtime_error("schema: unknown type '" + type + "'");
  }

  const json& resolve(const std::string& ref) const {
    if (!ref.starts_with("#")) throw std::runtime_error("schema: $ref '" + ref + "' is not local");
    return root_.at(json::json_pointer(ref.substr(1)));
  }

  void check(const json& value, const json& schema, const std::string& path,
             std::vector<std::string>& out) const {
    static const std::set<std::string> kKnown = {"$schema",     "$id",      "title",
                                                 "description", "$defs",    "type",
                                                 "properties",  "required", "additionalProperties",
                                                 "items",       "enum",     "const",
                                                 "minimum",     "minItems", "oneOf",
                                                 "$ref"};
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) out.push_back(path + ": not allowed");
      return;
    }
    for (const auto& [keyword, unused] : schema.items())
      if (!kKnown.contains(keyword))
        throw std::runtime_error("schema: keyword '" + keyword + "' is not supported");
    if (schema.contains("$ref")) check(value, resolve(schema["$ref"]), path, out);
    if (schema.contains("type")) {
      const json& type = schema["type"];
      bool ok = false;
      for (const json& t : type.is_array() ? type : json::array({type}))
        ok = ok || has_type(value, t.get<std::string>());
      if (!ok) {
        out.push_back(fmt::format("{}: {} is not of type {}", path, value.dump(), type.dump()));
        return;
      }
    }
    if (schema.contains("const") && value != schema["const"])
      out.push_back(fmt::format("{}: {} is not {}", path, value.dump(), schema["const"].dump()));
    if (schema.contains("enum")) {
      bool found = false;
      for (const json& option : schema["enum"]) found = found || value == option;
      if (!found)
        out.push_back(
            fmt::format("{}: {} is not one of {}", path, value.dump(), schema["enum"].dump()));
    }
    if (schema.contains("minimum") && value.is_number() &&
        value.get<double>() < schema["minimum"].get<double>())
      out.push_back(
          fmt::format("{}: {} is below {}", path, value.dump(), schema["minimum"].dump()));
    if (value.is_object()) {
      for (const json& name : schema.value("required", json::array()))
        if (!value.contains(name.get<std::string>()))
          out.push_back(fmt::format("{}: '{}' is missing", path, name.get<std::string>()));
      const json properties = schema.value("properties", json::object());
      for (const auto& [key, item] : value.items()) {
        const std::string at = path + "." + key;
        if (properties.contains(key))
          check(item, properties[key], at, out);
        else if (schema.contains("additionalProperties"))
          check(item, schema["additionalProperties"], at, out);
      }
    }
    if (value.is_array()) {
      if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>())
        out.push_back(fmt::format("{}: {} items, fewer than {}", path, value.size(),
                                  schema["minItems"].get<size_t>()));
      if (schema.contains("items"))
        for (size_t i = 0; i < value.size(); ++i)
          check(value[i], schema["items"], fmt::format("{}[{}]", path, i), out);
    }
    if (schema.contains("oneOf")) {
      int matched = 0;
      for (const json& option : schema["oneOf"]) {
        std::vector<std::string> errors;
        check(value, option, path, errors);
        matched += errors.empty();
      }
      if (matched != 1)
        out.push_back(fmt::format("{}: matches {} of the oneOf schemas, not 1", path, matched));
    }
  }

  json root_;
};

/// The schema docs/schemas/NAME.schema.json.
json schema_file(const std::string& name) {
  return json::parse(
      testing::read_bytes(std::string(STAGECRAFT_ROOT) + "/docs/schemas/" + name + ".schema.json"));
}

/// Checks `instance` against `schema`, printing every failure.
void check_valid(const SchemaValidator& schema, const json& instance, const std::string& what) {
  std::vector<std::string> errors = schema.errors(instance);
  INFO(what);
  CHECK_MESSAGE(errors.empty(), fmt::format("{}", fmt::join(errors, "\n")));
}

using testing::run_command;

/// The records of a JSON Lines output: every line one complete JSON object, at least one.
std::vector<json> json_lines(const std::string& text, const std::string& what) {
  INFO(what);
  std::vector<json> records;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    json record = json::parse(line, nullptr, false);
    CHECK_MESSAGE(record.is_object(), "not a JSON object on one line: " << line.substr(0, 80));
    records.push_back(record);
  }
  CHECK(!records.empty());
  return records;
}

TEST_CASE("the minimal validator accepts what the schema allows and names what it does not") {
  SchemaValidator schema(json::parse(R"({
    "type": "object", "required": ["n", "kind"], "additionalProperties": false,
    "$defs": {"count": {"type": "integer", "minimum": 0}},
    "properties": {
      "n": {"$ref": "#/$defs/count"},
      "kind": {"enum": ["a", "b"]},
      "list": {"type": "array", "minItems": 1, "items": {"type": ["string", "null"]}},
      "version": {"const": 2},
      "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
      "map": {"type": "object", "additionalProperties": {"type": "boolean"}}
    }})"));
  CHECK(schema
            .errors(json::parse(
                R"({"n": 3, "kind": "a", "list": ["x", null], "version": 2, "either": 1,
                    "map": {"p": true}})"))
            .empty());
  CHECK(schema.errors(json::parse(R"({"n": 3.0, "kind": "b"})")).empty());
  auto first_error = [&](const char* text) {
    std::vector<std::string> errors = schema.errors(json::parse(text));
    REQUIRE(!errors.empty());
    return errors.front();
  };
  CHECK(first_error(R"({"kind": "a"})") == "$: 'n' is missing");
  CHECK(first_error(R"({"n": -1, "kind": "a"})") == "$.n: -1 is below 0");
  CHECK(first_error(R"({"n": 1.5, "kind": "a"})") == "$.n: 1.5 is not of type \"integer\"");
  CHECK(first_error(R"({"n": 1, "kind": "c"})") == "$.kind: \"c\" is not one of [\"a\",\"b\"]");
  CHECK(first_error(R"({"n": 1, "kind": "a", "extra": 1})") == "$.extra: not allowed");
  CHECK(first_error(R"({"n": 1, "kind": "a", "list": []})") == "$.list: 0 items, fewer than 1");
  CHECK(first_error(R"({"n": 1, "kind": "a", "list": [3]})") ==
        "$.list[0]: 3 is not of type [\"string\",\"null\"]");
  CHECK(first_error(R"({"n": 1, "kind": "a", "version": 1})") == "$.version: 1 is not 2");
  CHECK(first_error(R"({"n": 1, "kind": "a", "either": true})") ==
        "$.either: matches 0 of the oneOf schemas, not 1");
  CHECK(first_error(R"({"n": 1, "kind": "a", "map": {"p": 1}})") ==
        "$.map.p: 1 is not of type \"boolean\"");
  SchemaValidator unsupported(json::parse(R"({"type": "string", "pattern": "^a"})"));
  CHECK_THROWS_WITH(unsupported.errors("a"), "schema: keyword 'pattern' is not supported");
}

TEST_CASE("every schema's format_version is the tool's") {
  CHECK(schema_file("stagec-info")["properties"]["format_version"]["const"] ==
        tools::kInfoJsonVersion);
  CHECK(schema_file("stagec-list-nodes")["properties"]["format_version"]["const"] ==
        tools::kListNodesJsonVersion);
  CHECK(schema_file("stagedump")["properties"]["format_version"]["const"] ==
        tools::kDumpJsonVersion);
  const json run = schema_file("stagerun");
  CHECK(run["$defs"]["step"]["properties"]["format_version"]["const"] == tools::kRunJsonVersion);
  CHECK(run["$defs"]["summary"]["properties"]["format_version"]["const"] == tools::kRunJsonVersion);
  CHECK(schema_file("trace")["properties"]["otherData"]["properties"]["format_version"]["const"] ==
        tools::kTraceJsonVersion);
}

TEST_CASE("the tools' JSON outputs are JSON Lines that their schemas accept") {
  testing::TempDir dir;
  const std::string samples = STAGECRAFT_SAMPLES;
  const std::string stagec = STAGECRAFT_STAGEC, stagedump = STAGECRAFT_STAGEDUMP,
                    stagerun = STAGECRAFT_STAGERUN;
  const SchemaValidator info(schema_file("stagec-info")), nodes(schema_file("stagec-list-nodes")),
      dump(schema_file("stagedump")), runs(schema_file("stagerun")), trace(schema_file("trace"));

  for (const std::string& model : {samples + "/gpt_tiny.onnx --batch 2 --dim seq=8",
                                   samples + "/resnet_small.onnx --batch 4"}) {
    std::vector<json> lines =
        json_lines(run_command(dir, stagec + " " + model + " --info --json"), model);
    REQUIRE(lines.size() == 1);
    check_valid(info, lines[0], "stagec --info --json " + model);
    lines = json_lines(run_command(dir, stagec + " " + model + " --list-nodes --json"), model);
    REQUIRE(lines.size() == 1);
    check_valid(nodes, lines[0], "stagec --list-nodes --json " + model);
  }

  const std::string gpt =
      samples + "/gpt_tiny.onnx --train --loss cross-entropy --batch 8 --dim seq=16";
  struct Plan {
    std::string name, args;
    bool training;
  };
  for (const Plan& p :
       {Plan{"zb", gpt + " --devices 3 --microbatches 4 --schedule zb-h1", true},
        // Gradient clipping's norm in every step record.
        Plan{"interleaved",
             gpt + " --devices 2 --microbatches 4 --schedule interleaved --clip-grad-norm 0.5",
             true},
        Plan{"inference",
             samples + "/mnist_cnn.onnx --batch 8 --devices 2 --microbatches 4 "
                       "--device-spec cpu",
             false}}) {
    CAPTURE(p.name);
    const std::string plan = dir.file(p.name);
    run_command(dir, fmt::format("{} {} -o {}", stagec, p.args, plan));
    std::vector<json> lines =
        json_lines(run_command(dir, stagedump + " " + plan + " --json"), p.name);
    REQUIRE(lines.size() == 1);
    check_valid(dump, lines[0], "stagedump --json " + p.name);
    check_valid(trace, json::parse(run_command(dir, stagedump + " " + plan + " --trace -")),
                "stagedump --trace " + p.name);

    const std::string measured = dir.file(p.name + ".trace.json");
    lines = json_lines(run_command(dir, fmt::format("{} {} --steps 3 -q --json --trace {}",
                                                    stagerun, plan, measured)),
                       p.name);
    // One record per step, in order, then the summary.
    REQUIRE(lines.size() == 4);
    for (int k = 0; k < 3; ++k) {
      CHECK(lines[k]["type"] == "step");
      CHECK(lines[k]["step"] == k + 1);
      CHECK(lines[k].contains("loss") == p.training);
      CHECK(lines[k].contains("grad_norm") == (p.name == "interleaved"));
      check_valid(runs, lines[k], fmt::format("stagerun --json {} step {}", p.name, k + 1));
    }
    CHECK(lines[3]["type"] == "summary");
    check_valid(runs, lines[3], "stagerun --json summary " + p.name);
    CHECK(lines[3]["spin_us"] == 0);  // waiting workers sleep unless told (--spin-us)
    check_valid(trace, json::parse(testing::read_bytes(measured)), "stagerun --trace " + p.name);
    // --profile-nodes adds its record after the summary.
    const std::vector<json> profiled = json_lines(
        run_command(dir, fmt::format("{} {} --steps 2 -q --json --profile-nodes --spin-us 50",
                                     stagerun, plan)),
        p.name);
    REQUIRE(profiled.size() == 4);
    CHECK(profiled[2]["spin_us"] == 50);
    CHECK(profiled[3]["type"] == "node_profile");
    CHECK(!profiled[3]["nodes"].empty());
    check_valid(runs, profiled[3], "stagerun --json --profile-nodes " + p.name);

    // The schemas are strict enough to notice: a missing key, a stray one, a wrong type.
    json missing = lines[3];
    missing.erase("median_step_ms");
    CHECK(!runs.errors(missing).empty());
    json stray = lines[0];
    stray["extra"] = 1;
    CHECK(!runs.errors(stray).empty());
    json mistyped = json::parse(run_command(dir, stagedump + " " + plan + " --json"));
    mistyped["devices"][0]["peak_bytes"] = "1 MiB";
    CHECK(!dump.errors(mistyped).empty());
  }

  // stagerun --tokens: every step record carries its epoch (200 tokens of 0: 12 windows of 16).
  const std::string stream = dir.file("tokens.bin");
  std::ofstream(stream, std::ios::binary) << std::string(400, '\0');
  std::vector<json> lines = json_lines(
      run_command(dir, fmt::format("{} {} --steps 3 -q --json --tokens {}", stagerun,
                                   dir.file("zb"), stream)),
      "tokens");
  REQUIRE(lines.size() == 4);
  for (int k = 0; k < 4; ++k)
    check_valid(runs, lines[k], fmt::format("stagerun --json --tokens record {}", k + 1));
  CHECK(lines[1]["epoch"] == 0);
  CHECK(lines[2]["epoch"] == 1);  // windows 16-23: 12 a pass

  // --eval-tokens: an eval record as each evaluation happens (after steps 2 and 3), before the
  // step records (the stream's 12 windows hold one batch of 8).
  lines = json_lines(run_command(dir, fmt::format("{} {} --steps 3 -q --json --tokens {} "
                                                  "--eval-tokens {} --eval-every 2",
                                                  stagerun, dir.file("zb"), stream, stream)),
                     "eval");
  REQUIRE(lines.size() == 6);
  for (int k = 0; k < 6; ++k)
    check_valid(runs, lines[k], fmt::format("stagerun --json --eval-tokens record {}", k + 1));
  CHECK(lines[0]["type"] == "eval");
  CHECK(lines[0]["step"] == 2);
  CHECK(lines[1]["type"] == "eval");
  CHECK(lines[1]["step"] == 3);
  CHECK(lines[1]["batches"] == 1);
  CHECK(lines[2]["type"] == "step");
  json stray = lines[0];
  stray["extra"] = 1;
  CHECK(!runs.errors(stray).empty());
  json missing = lines[0];
  missing.erase("loss");
  CHECK(!runs.errors(missing).empty());
}

TEST_CASE("stagec --auto's search in plan.json and stagedump --json match their schemas") {
  testing::TempDir dir;
  const std::string stagec = STAGECRAFT_STAGEC, stagedump = STAGECRAFT_STAGEDUMP;
  const std::string plan = dir.file("auto");
  run_command(dir, fmt::format("{} {}/mnist_cnn.onnx --batch 8 --devices 2 --device-spec cpu "
                               "--auto -o {}",
                               stagec, STAGECRAFT_SAMPLES, plan));
  const json written = json::parse(testing::read_bytes(plan + "/plan.json"));
  REQUIRE(written.contains("auto_search"));
  const SchemaValidator search(schema_file("plan-auto-search")), dump(schema_file("stagedump"));
  check_valid(search, written["auto_search"], "plan.json auto_search");
  std::vector<json> lines = json_lines(run_command(dir, stagedump + " " + plan + " --json"), plan);
  REQUIRE(lines.size() == 1);
  check_valid(dump, lines[0], "stagedump --json of an --auto plan");
  CHECK(lines[0]["auto_search"] == written["auto_search"]);
  json stray = written["auto_search"];
  stray[0]["status"] = "best";
  CHECK(!search.errors(stray).empty());
}

}  // namespace
}  // namespace stagecraft
