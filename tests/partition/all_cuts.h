#pragma once
/// \file
/// Brute force for the partition tests: every split small enough to enumerate.

#include <vector>

namespace stagecraft::partition::testing {

/// Every way to cut positions [0, n) into `stages` non-empty runs, as cut-after lists, appended
/// to `out`; `cur` holds the cuts chosen so far (call with `from` 0 and `cur` empty).
inline void all_cuts(int n, int stages, int from, std::vector<int>& cur,
                     std::vector<std::vector<int>>& out) {
  if (static_cast<int>(cur.size()) == stages - 1) {
    out.push_back(cur);
    return;
  }
  for (int c = from; c < n - 1; ++c) {
    cur.push_back(c);
    all_cuts(n, stages, c + 1, cur, out);
    cur.pop_back();
  }
}

}  // namespace stagecraft::partition::testing
