// The strict JSON reader every file of stagecraft goes through: one wording for every error.
#include "runtime/format/json_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "runtime/format/error.h"
#include "runtime/format/suggest.h"

namespace stagecraft {
namespace {

/// A value for messages: its JSON text, cut at 40 characters.
std::string shown(const nlohmann::json& value) {
  std::string text = value.dump();
  return text.size() > 40 ? text.substr(0, 37) + "..." : text;
}

/// The JSON type of a value for messages ("string", "array", "number", ...).
std::string type_of(const nlohmann::json& value) { return value.type_name(); }

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    throw Error(ErrorKind::kIo, "is not a regular file").in(path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(ErrorKind::kIo, fmt::format("cannot open ({})", std::strerror(errno))).in(path);
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorKind::kIo, "read error").in(path);
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    // A syntax error, or a number too large for a double ("1e999": out_of_range.406). Drop
    // nlohmann's "[json.exception.parse_error.101] " tag; keep the position and the reason.
    std::string reason = e.what();
    if (auto tag = reason.find("] ");
        reason.starts_with("[json.exception") && tag != std::string::npos) {
      reason = reason.substr(tag + 2);
    }
    throw Error(ErrorKind::kFormat, "not valid JSON: " + reason).in(path);
  }
}

// ---------------------------------------------------------------------------------------------
// JsonValue

JsonValue::JsonValue(const nlohmann::json& value, std::string file, std::string path)
    : value_(&value), file_(std::move(file)), path_(std::move(path)) {}

void JsonValue::fail(std::string_view problem) const {
  std::string where = path_.empty() ? "the file" : fmt::format("field '{}'", path_);
  throw Error(ErrorKind::kFormat, fmt::format("{} {}", where, problem)).in(file_);
}

void JsonValue::expect(bool ok, std::string_view what) const {
  if (!ok) fail(fmt::format("must be {}, not {}", what, type_of(*value_)));
}

JsonObject JsonValue::object(std::initializer_list<std::string_view> known) const {
  JsonObject object = this->object();
  object.only(known);
  return object;
}

JsonObject JsonValue::object() const {
  expect(value_->is_object(), "a JSON object");
  return JsonObject(*this);
}

double JsonValue::number() const {
  expect(value_->is_number(), "a number");
  double number = value_->get<double>();
  if (!std::isfinite(number)) fail("must be finite");
  return number;
}

double JsonValue::positive_number(double max) const {
  double value = number();
  if (value <= 0) fail(fmt::format("must be positive, not {}", shown(*value_)));
  if (max > 0 && value > max) fail(fmt::format("must be at most {}, not {}", max, value));
  return value;
}

int64_t JsonValue::int64() const {
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  auto refuse = [&] {
    fail(fmt::format("must be a whole number that fits in int64, not {}", shown(*value_)));
  };
  if (value_->is_number_unsigned()) {
    if (value_->get<uint64_t>() > static_cast<uint64_t>(kMax)) refuse();
    return static_cast<int64_t>(value_->get<uint64_t>());
  }
  if (value_->is_number_integer()) return value_->get<int64_t>();
  // A number written as 8e10 is read when it is whole; 2^63 and beyond do not fit.
  double value = number();
  if (value != std::floor(value) || value >= 9223372036854775808.0 ||
      value < -9223372036854775808.0) {
    refuse();
  }
  return static_cast<int64_t>(value);
}

int64_t JsonValue::positive_int64() const {
  int64_t value = int64();
  if (value <= 0) fail(fmt::format("must be positive, not {}", value));
  return value;
}

int JsonValue::int32() const {
  // Every int32 is exact as a double, and anything beyond int64 is beyond int32 too.
  double value = number();
  if (value != std::floor(value) || value < std::numeric_limits<int>::min() ||
      value > std::numeric_limits<int>::max()) {
    fail(fmt::format("must be a whole number that fits in int32, not {}", shown(*value_)));
  }
  return static_cast<int>(value);
}

std::string JsonValue::string() const {
  expect(value_->is_string(), "a string");
  return value_->get<std::string>();
}

std::string JsonValue::nonempty_string() const {
  std::string text = string();
  if (text.empty()) fail("must not be empty");
  return text;
}

bool JsonValue::boolean() const {
  expect(value_->is_boolean(), "a boolean");
  return value_->get<bool>();
}

void JsonValue::check_array() const { expect(value_->is_array(), "an array"); }

JsonValue JsonValue::element(size_t i) const {
  return JsonValue((*value_)[i], file_, fmt::format("{}[{}]", path_, i));
}

// ---------------------------------------------------------------------------------------------
// JsonObject

std::string JsonObject::child_path(std::string_view name) const {
  return value_.path().empty() ? std::string(name) : fmt::format("{}.{}", value_.path(), name);
}

void JsonObject::only(std::initializer_list<std::string_view> known) const {
  for (const auto& item : raw().items()) {
    if (std::find(known.begin(), known.end(), item.key()) != known.end()) continue;
    throw Error(ErrorKind::kFormat,
                fmt::format("unknown field '{}'{}; expected: {}", child_path(item.key()),
                            did_you_mean(item.key(), std::vector<std::string_view>(known)),
                            fmt::join(known, ", ")))
        .in(value_.file());
  }
}

bool JsonObject::has(std::string_view name) const { return raw().find(name) != raw().end(); }

JsonValue JsonObject::at(std::string_view name) const {
  auto found = find(name);
  if (!found) fail(name, "is missing");
  return *found;
}

std::optional<JsonValue> JsonObject::find(std::string_view name) const {
  auto it = raw().find(name);
  if (it == raw().end()) return std::nullopt;
  return JsonValue(*it, value_.file(), child_path(name));
}

std::vector<std::pair<std::string, JsonValue>> JsonObject::entries() const {
  std::vector<std::pair<std::string, JsonValue>> list;
  for (const auto& item : raw().items()) {
    list.emplace_back(item.key(), JsonValue(item.value(), value_.file(),
                                            fmt::format("{}[\"{}\"]", value_.path(), item.key())));
  }
  return list;
}

void JsonObject::fail(std::string_view name, std::string_view problem) const {
  throw Error(ErrorKind::kFormat, fmt::format("field '{}' {}", child_path(name), problem))
      .in(value_.file());
}

}  // namespace stagecraft
