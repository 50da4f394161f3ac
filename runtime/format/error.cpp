#include "runtime/format/error.h"

namespace stagecraft {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kUsage: return "usage";
    case ErrorKind::kIo: return "i/o";
    case ErrorKind::kFormat: return "format";
    case ErrorKind::kModel: return "model";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kShape: return "shape";
    case ErrorKind::kPlan: return "plan";
    case ErrorKind::kMemory: return "memory";
    case ErrorKind::kInternal: return "internal";
  }
  return "unknown";
}

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kUsage: return 2;
    case ErrorKind::kInternal: return 70;
    default: return 1;
  }
}

Error::Error(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {
  rebuild();
}

Error& Error::in(std::string context) & {
  context_.insert(context_.begin(), std::move(context));
  rebuild();
  return *this;
}

Error&& Error::in(std::string context) && {
  return std::move(in(std::move(context)));
}

void Error::rebuild() {
  line_.clear();
  for (const auto& c : context_) {
    line_ += c;
    line_ += ": ";
  }
  line_ += message_;
}

}  // namespace stagecraft
