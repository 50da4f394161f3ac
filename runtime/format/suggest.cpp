#include "runtime/format/suggest.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace stagecraft {
namespace {

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rows of the dynamic programme: i - 2, i - 1 and i.
  const std::size_t n = b.size();
  std::vector<std::size_t> before(n + 1), previous(n + 1), current(n + 1);
  for (std::size_t j = 0; j <= n; ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= n; ++j) {
      const bool same = lower(a[i - 1]) == lower(b[j - 1]);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
          lower(a[i - 2]) == lower(b[j - 1]))
        current[j] = std::min(current[j], before[j - 2] + 1);
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[n];
}

std::optional<std::string> closest_name(std::string_view typed,
                                        const std::vector<std::string_view>& known) {
  if (std::find(known.begin(), known.end(), typed) != known.end()) return std::nullopt;
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (std::string_view name : known) {
    const std::size_t longer = std::max(typed.size(), name.size());
    const std::size_t shorter = std::min(typed.size(), name.size());
    // The length difference alone is a lower bound of the distance: skip hopeless names unread.
    if (3 * (longer - shorter) > longer) continue;
    const std::size_t d = edit_distance(typed, name);
    if (3 * d > longer || (best && d >= best_distance)) continue;
    best = std::string(name);
    best_distance = d;
  }
  return best;
}

std::string did_you_mean(std::string_view typed, const std::vector<std::string_view>& known) {
  std::optional<std::string> name = closest_name(typed, known);
  return name ? fmt::format(" (did you mean '{}'?)", *name) : std::string();
}

}  // namespace stagecraft
