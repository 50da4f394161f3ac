#include "runtime/format/bytes.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string_view>

namespace stagecraft {

std::string format_bytes(double bytes) {
  constexpr std::array<std::string_view, 5> kUnits = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (std::abs(bytes) < 1024) return fmt::format("{:.0f} B", bytes);
  double value = bytes / 1024;
  size_t unit = 0;
  for (; std::abs(value) >= 1024 && unit + 1 < kUnits.size(); value /= 1024) ++unit;
  // Rounding may carry to the next unit's 1024 ("1024 KiB"): print it there instead.
  if (std::abs(value) >= 1023.5 && unit + 1 < kUnits.size()) {
    value /= 1024;
    ++unit;
  }
  int decimals = std::abs(value) < 9.995 ? 2 : std::abs(value) < 99.95 ? 1 : 0;
  return fmt::format("{:.{}f} {}", value, decimals, kUnits[unit]);
}

}  // namespace stagecraft
