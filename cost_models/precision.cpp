#include "cost_models/precision.h"

#include "runtime/format/error.h"

namespace stagecraft::cost {

std::string_view to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kMixed: return "mixed";
  }
  return "unknown";
}

Precision parse_precision(std::string_view name) {
  for (Precision p : {Precision::kFp32, Precision::kMixed}) {
    if (name == to_string(p)) return p;
  }
  fail(ErrorKind::kUsage, "unknown precision '{}'; valid: fp32, mixed", name);
}

}  // namespace stagecraft::cost
