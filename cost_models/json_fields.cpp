#include "cost_models/json_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "runtime/format/error.h"

namespace stagecraft::cost::detail {
namespace {

[[noreturn]] void field_error(const FieldSource& source, std::string_view name,
                              const std::string& problem) {
  throw Error(ErrorKind::kFormat, fmt::format("field '{}{}' {}", source.prefix, name, problem))
      .in(source.file);
}

/// The field as a finite number; refuses strings, booleans, null and nested values.
double number_field(const nlohmann::json& object, std::string_view name,
                    const FieldSource& source) {
  const nlohmann::json& value = required_field(object, name, source);
  if (!value.is_number()) {
    field_error(source, name, fmt::format("must be a number, not {}", value.type_name()));
  }
  double number = value.get<double>();
  if (!std::isfinite(number)) field_error(source, name, "must be finite");
  if (number <= 0) field_error(source, name, fmt::format("must be positive, not {}", value.dump()));
  return number;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(ErrorKind::kIo, "not a readable file").in(path);
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw Error(ErrorKind::kIo, "cannot be read").in(path);
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 1, ..."; keep the part
    // a person reads.
    std::string what = e.what();
    auto start = what.find("] ");
    throw Error(ErrorKind::kFormat,
                "not valid JSON: " + (start == std::string::npos ? what : what.substr(start + 2)))
        .in(path);
  }
}

void check_object(const nlohmann::json& value, std::initializer_list<std::string_view> fields,
                  const FieldSource& source) {
  std::string where =
      source.prefix.empty()
          ? std::string("the file")
          : fmt::format("field '{}'", source.prefix.substr(0, source.prefix.size() - 1));
  if (!value.is_object()) {
    throw Error(ErrorKind::kFormat,
                fmt::format("{} must be a JSON object, not {}", where, value.type_name()))
        .in(source.file);
  }
  for (const auto& [key, unused] : value.items()) {
    bool known = false;
    for (std::string_view field : fields) known = known || key == field;
    if (!known) {
      throw Error(ErrorKind::kFormat, fmt::format("unknown field '{}{}'; expected: {}",
                                                  source.prefix, key, fmt::join(fields, ", ")))
          .in(source.file);
    }
  }
}

const nlohmann::json& required_field(const nlohmann::json& object, std::string_view name,
                                     const FieldSource& source) {
  auto it = object.find(name);
  if (it == object.end()) field_error(source, name, "is missing");
  return *it;
}

double positive_number(const nlohmann::json& object, std::string_view name,
                       const FieldSource& source, double max) {
  double number = number_field(object, name, source);
  if (max > 0 && number > max) {
    field_error(source, name, fmt::format("must be at most {}, not {}", max, number));
  }
  return number;
}

int64_t positive_integer(const nlohmann::json& object, std::string_view name,
                         const FieldSource& source) {
  const nlohmann::json& value = required_field(object, name, source);
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  // JSON integers are read exactly; a number written as 8e10 is accepted when it is whole.
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(kMax)) {
    field_error(source, name, fmt::format("must fit in int64, not {}", value.dump()));
  }
  if (value.is_number_integer()) {
    int64_t number = value.get<int64_t>();
    if (number <= 0) field_error(source, name, fmt::format("must be positive, not {}", number));
    return number;
  }
  double number = number_field(object, name, source);
  // 2^63 is exactly representable as a double; anything at or above it does not fit.
  if (number != std::floor(number) || number >= 9223372036854775808.0) {
    field_error(source, name,
                fmt::format("must be a whole number that fits in int64, not {}", value.dump()));
  }
  return static_cast<int64_t>(number);
}

std::string nonempty_string(const nlohmann::json& object, std::string_view name,
                            const FieldSource& source) {
  const nlohmann::json& value = required_field(object, name, source);
  if (!value.is_string()) {
    field_error(source, name, fmt::format("must be a string, not {}", value.type_name()));
  }
  std::string text = value.get<std::string>();
  if (text.empty()) field_error(source, name, "must not be empty");
  return text;
}

}  // namespace stagecraft::cost::detail
