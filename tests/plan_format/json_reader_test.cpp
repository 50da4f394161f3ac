// The strict JSON reader every file goes through: types, ranges, unknown and missing fields,
// paths in messages, and the file-level errors.
#include "runtime/format/json_reader.h"

#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "runtime/format/error.h"
#include "tests/error_of.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using testing::error_of;

TEST_CASE("the JSON reader reads typed fields and names the field path in each refusal") {
  nlohmann::json doc = nlohmann::json::parse(R"({
    "n": 3, "big": 8e10, "neg": -2, "half": 0.5, "name": "x", "empty": "", "on": true,
    "list": [1, 2, "three"], "nested": {"inner": {"deep": null}}, "map": {"a b": 1},
    "huge": 18446744073709551615, "wide": 3000000000})");
  JsonObject top = JsonValue(doc, "f.json").object();
  CHECK(top.int32("n") == 3);
  CHECK(top.int64("big") == 80'000'000'000);
  CHECK(top.positive_number("half", 1.0) == 0.5);
  CHECK(top.nonempty_string("name") == "x");
  CHECK(top.boolean("on"));
  CHECK(top.has("n"));
  CHECK_FALSE(top.find("absent").has_value());
  CHECK(top.int64("wide") == 3'000'000'000);

  auto refused = [&](auto body, const std::string& expected) {
    CHECK(error_of(ErrorKind::kFormat, body) == "f.json: " + expected);
  };
  refused([&] { top.int32("absent"); }, "field 'absent' is missing");
  refused([&] { top.int32("half"); },
          "field 'half' must be a whole number that fits in int32, not 0.5");
  refused([&] { top.int32("wide"); },
          "field 'wide' must be a whole number that fits in int32, not 3000000000");
  refused([&] { top.int64("huge"); },
          "field 'huge' must be a whole number that fits in int64, not 18446744073709551615");
  refused([&] { top.positive_int64("neg"); }, "field 'neg' must be positive, not -2");
  refused([&] { top.positive_number("n", 1.0); }, "field 'n' must be at most 1, not 3");
  refused([&] { top.nonempty_string("empty"); }, "field 'empty' must not be empty");
  refused([&] { top.string("n"); }, "field 'n' must be a string, not number");
  refused([&] { top.at("list").int64s(); }, "field 'list[2]' must be a number, not string");
  refused([&] { top.at("name").int64s(); }, "field 'name' must be an array, not string");
  refused([&] { top.object("nested", {"inner"}).object("inner", {"deep"}).number("deep"); },
          "field 'nested.inner.deep' must be a number, not null");
  refused([&] { top.object("nested", {"outer"}); },
          "unknown field 'nested.inner'; expected: outer");
  refused([&] { top.at("map").object().entries().at(0).second.string(); },
          "field 'map[\"a b\"]' must be a string, not number");
  refused([&] { JsonValue(nlohmann::json::array(), "f.json").object(); },
          "the file must be a JSON object, not array");
}

TEST_CASE("read_json_file names the file when it is missing, a folder or not JSON") {
  testing::TempDir dir;
  CHECK(error_of(ErrorKind::kIo, [&] { read_json_file(dir.file("none.json")); }) ==
        dir.file("none.json") + ": cannot open (No such file or directory)");
  CHECK(error_of(ErrorKind::kIo, [&] {
          read_json_file(dir.path().string());
        }).ends_with(": is not a regular file"));
  std::ofstream(dir.file("bad.json")) << "{\"a\": 1,\n";
  CHECK(error_of(ErrorKind::kFormat, [&] {
          read_json_file(dir.file("bad.json"));
        }).starts_with(dir.file("bad.json") + ": not valid JSON: parse error at line 2"));
  std::ofstream(dir.file("good.json")) << "{\"a\": [1, 2]}";
  CHECK(read_json_file(dir.file("good.json"))["a"][1] == 2);
}

}  // namespace
}  // namespace stagecraft
