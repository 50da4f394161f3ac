#pragma once
/// \file
/// The one strict reader of the JSON files stagecraft reads (plan.json, device and cluster specs,
/// the profile database, checkpoint manifests, schedule.json): open and parse with the file named,
/// required and optional typed fields, unknown fields refused (a misspelt field would otherwise
/// read as a default), numbers checked for type and range. Every error is one line of kind
/// `kFormat` (`kIo` when the file cannot be read) naming the file and the field path:
///
///   plan.json: field 'stages[2].inputs[0].shape[1]' must be a number, not string
///   h.json: unknown field 'memory_bandwith' (did you mean 'memory_bandwidth'?); expected: ...
///   c.json: field 'inter_node.latency_s' must be positive, not -1e-06

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stagecraft {

/// Parses the JSON file at `path`. Throws `Error(kIo)` when it cannot be read ("cannot open (No
/// such file or directory)", "is not a regular file") and `Error(kFormat)` when it is not JSON
/// ("not valid JSON: parse error at line 3, column 3: ..."); both name `path`.
nlohmann::json read_json_file(const std::string& path);

class JsonObject;

/// One value of a JSON document with where it sits: the file and its field path ("" for the
/// document itself, "stages[2].memory" deeper down). Holds a reference to the value: the document
/// must outlive it.
class JsonValue {
 public:
  /// The value `value` of `file` at `path` ("" for the whole document).
  JsonValue(const nlohmann::json& value, std::string file, std::string path = "");

  const nlohmann::json& raw() const { return *value_; }
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }

  /// Throws `Error(kFormat)` "FILE: field 'PATH' PROBLEM" ("FILE: the file PROBLEM" for the
  /// document itself).
  [[noreturn]] void fail(std::string_view problem) const;

  /// This value as an object whose keys are all in `known` ("unknown field 'x.y'; expected: ..."
  /// otherwise).
  JsonObject object(std::initializer_list<std::string_view> known) const;
  /// This value as an object with any keys (a map keyed by name, or one whose version decides
  /// its fields: call `JsonObject::only` after).
  JsonObject object() const;

  /// A finite number.
  double number() const;
  /// A finite number > 0 (and <= `max` when `max` > 0).
  double positive_number(double max = 0) const;
  /// A whole number that fits in int64 (written as 8e10 is accepted when whole).
  int64_t int64() const;
  /// A whole number > 0 that fits in int64.
  int64_t positive_int64() const;
  /// A whole number that fits in int.
  int int32() const;
  std::string string() const;
  /// A string that is not empty.
  std::string nonempty_string() const;
  bool boolean() const;

  /// The elements of this array, each read by `read(const JsonValue& element)` (its path
  /// "PATH[i]").
  template <typename Read>
  auto array(Read read) const {
    check_array();
    std::vector<decltype(read(*this))> values;
    values.reserve(value_->size());
    for (size_t i = 0; i < value_->size(); ++i) values.push_back(read(element(i)));
    return values;
  }
  std::vector<int64_t> int64s() const {
    return array([](const JsonValue& v) { return v.int64(); });
  }
  std::vector<int> int32s() const {
    return array([](const JsonValue& v) { return v.int32(); });
  }
  std::vector<double> numbers() const {
    return array([](const JsonValue& v) { return v.number(); });
  }
  std::vector<std::string> strings() const {
    return array([](const JsonValue& v) { return v.string(); });
  }

 private:
  void check_array() const;
  JsonValue element(size_t i) const;
  /// "must be WHAT, not TYPE" unless `ok`.
  void expect(bool ok, std::string_view what) const;

  const nlohmann::json* value_;
  std::string file_;
  std::string path_;
};

/// A JSON object read field by field; each field's errors carry its path.
class JsonObject {
 public:
  /// `value` must be an object (checked by `JsonValue::object`).
  explicit JsonObject(JsonValue value) : value_(std::move(value)) {}

  const JsonValue& value() const { return value_; }
  const nlohmann::json& raw() const { return value_.raw(); }

  /// Refuses any key not in `known` ("unknown field 'PATH.key'; expected: a, b, c").
  void only(std::initializer_list<std::string_view> known) const;

  bool has(std::string_view name) const;
  /// The field `name`: "field 'PATH.name' is missing" when absent.
  JsonValue at(std::string_view name) const;
  /// The field `name`, or nullopt when absent.
  std::optional<JsonValue> find(std::string_view name) const;
  /// Every (key, value) in the object's order, each value's path "PATH[\"key\"]" (maps keyed by
  /// name).
  std::vector<std::pair<std::string, JsonValue>> entries() const;

  /// Throws `Error(kFormat)` "FILE: field 'PATH.name' PROBLEM".
  [[noreturn]] void fail(std::string_view name, std::string_view problem) const;

  // Shorthands for `at(name).<reader>()`.
  JsonObject object(std::string_view name, std::initializer_list<std::string_view> known) const {
    return at(name).object(known);
  }
  double number(std::string_view name) const { return at(name).number(); }
  double positive_number(std::string_view name, double max = 0) const {
    return at(name).positive_number(max);
  }
  int64_t int64(std::string_view name) const { return at(name).int64(); }
  int64_t positive_int64(std::string_view name) const { return at(name).positive_int64(); }
  int int32(std::string_view name) const { return at(name).int32(); }
  std::string string(std::string_view name) const { return at(name).string(); }
  std::string nonempty_string(std::string_view name) const { return at(name).nonempty_string(); }
  bool boolean(std::string_view name) const { return at(name).boolean(); }
  template <typename Read>
  auto array(std::string_view name, Read read) const {
    return at(name).array(read);
  }

 private:
  std::string child_path(std::string_view name) const;

  JsonValue value_;
};

}  // namespace stagecraft
