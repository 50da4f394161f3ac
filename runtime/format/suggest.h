#pragma once
/// \file
/// "Did you mean" for names a user typed: the known name closest to a misspelt one, by edit
/// distance. Used where a name is looked up in a known list and refused (a flag, a node for
/// --split-after, a field of a JSON file, a device preset), so the one-line error can name the
/// likely intended spelling.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stagecraft {

/// The number of single-character insertions, deletions, substitutions and swaps of two
/// neighbouring characters that turn `a` into `b` (the optimal-string-alignment distance),
/// comparing ASCII letters without regard to case.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The name in `known` closest to `typed`, when it is close enough to be a misspelling of it (at
/// most a third of the longer name's characters differ); the first of equally close names;
/// nullopt when none is close, or when `typed` is itself in `known`.
std::optional<std::string> closest_name(std::string_view typed,
                                        const std::vector<std::string_view>& known);

/// " (did you mean 'X'?)" for the closest name of `known`, or "" when none is close: appended to
/// an "unknown ..." message.
std::string did_you_mean(std::string_view typed, const std::vector<std::string_view>& known);

}  // namespace stagecraft
