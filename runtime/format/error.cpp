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
    case ErrorKind::kTimeout: return "timeout";
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

namespace {

/// `text` with every control character written as an escape: an error is one line even when it
/// quotes bytes of a hostile file (a .npy key holding a newline).
void append_one_line(std::string& out, std::string_view text) {
  for (char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += ' ';
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += ch;
    }
  }
}

}  // namespace

void Error::rebuild() {
  line_.clear();
  for (const auto& c : context_) {
    append_one_line(line_, c);
    line_ += ": ";
  }
  append_one_line(line_, message_);
}

}  // namespace stagecraft
