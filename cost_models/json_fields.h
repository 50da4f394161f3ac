#pragma once
/// \file
/// Reading the small JSON description files of the cost models (device and cluster specs)
/// with one-line errors that name the file and the field. Internal to cost_models.

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace stagecraft::cost::detail {

/// Where a field is read from, for messages: the file (or "plan.json") and the dotted path of
/// the enclosing object ("" at the top, "intra_node." inside one).
struct FieldSource {
  std::string file;
  std::string prefix;
};

/// Parses the JSON file at `path`. Throws `Error(kIo)` when it cannot be read and
/// `Error(kFormat)` when it is not JSON; both messages start with `path`.
nlohmann::json read_json_file(const std::string& path);

/// Throws `Error(kFormat)` unless `value` is an object whose keys are all in `fields`: a
/// misspelt field would otherwise be silently replaced by a default.
void check_object(const nlohmann::json& value, std::initializer_list<std::string_view> fields,
                  const FieldSource& source);

/// The field `name` of `object` as a finite number > 0 (and <= `max` when given).
double positive_number(const nlohmann::json& object, std::string_view name,
                       const FieldSource& source, double max = 0);

/// The field `name` of `object` as a whole number > 0 that fits in int64.
int64_t positive_integer(const nlohmann::json& object, std::string_view name,
                         const FieldSource& source);

/// The field `name` of `object` as a non-empty string.
std::string nonempty_string(const nlohmann::json& object, std::string_view name,
                            const FieldSource& source);

/// The field `name` of `object`, which must be present (it is checked by the caller).
const nlohmann::json& required_field(const nlohmann::json& object, std::string_view name,
                                     const FieldSource& source);

}  // namespace stagecraft::cost::detail
