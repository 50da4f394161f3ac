#pragma once
/// \file
/// Overflow-checked int64 arithmetic for numbers read from files we did not write (sizes,
/// offsets, counts, steps). A hostile file can hold any value; forming `offset + bytes` or
/// `numel * size` unchecked is undefined behaviour and, worse, can wrap past a range check.
/// The `checked_*` functions throw an `Error` naming the field and the numbers; the `try_*`
/// ones return nothing on overflow for callers that phrase their own refusal.

#include <cstdint>
#include <optional>
#include <string_view>

#include "runtime/format/error.h"

namespace stagecraft {

/// `a + b`, or nothing where it overflows int64.
inline std::optional<int64_t> try_add(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// `a * b`, or nothing where it overflows int64.
inline std::optional<int64_t> try_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// `a - b`, or nothing where it overflows int64.
inline std::optional<int64_t> try_sub(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_sub_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// `a + b`; throws `Error(kind, "<field>: a + b overflows int64")` where it overflows.
inline int64_t checked_add(int64_t a, int64_t b, std::string_view field,
                           ErrorKind kind = ErrorKind::kFormat) {
  if (auto out = try_add(a, b)) return *out;
  fail(kind, "{}: {} + {} overflows int64", field, a, b);
}

/// `a * b`; throws `Error(kind, "<field>: a x b overflows int64")` where it overflows.
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view field,
                           ErrorKind kind = ErrorKind::kFormat) {
  if (auto out = try_mul(a, b)) return *out;
  fail(kind, "{}: {} x {} overflows int64", field, a, b);
}

/// True where `[offset, offset + length)` lies inside `[0, limit)`, all three non-negative;
/// the sum is never formed, so a hostile offset near 2^63 cannot wrap past the check.
inline bool range_within(int64_t offset, int64_t length, int64_t limit) {
  return offset >= 0 && length >= 0 && limit >= 0 && length <= limit && offset <= limit - length;
}

}  // namespace stagecraft
