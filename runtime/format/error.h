#pragma once
/// \file
/// The one error type of stagecraft. Every failure the user can cause (a bad model, a bad plan,
/// a bad flag) is an `Error` with a category and a chain of context (file, node, field), caught
/// in `main()` and printed as one line with a non-zero exit code.

#include <fmt/format.h>

#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace stagecraft {

/// What kind of thing went wrong; decides the process exit code.
enum class ErrorKind {
  kUsage,        ///< A bad command-line flag or value.
  kIo,           ///< A file could not be read or written.
  kFormat,       ///< A file is not what it claims to be (not a protobuf, truncated, bad JSON).
  kModel,        ///< The model is malformed (cycle, dangling input, bad shape).
  kUnsupported,  ///< Valid input that stagecraft does not handle (op, dtype, opset).
  kShape,        ///< Shapes could not be bound or inferred.
  kPlan,         ///< A plan is inconsistent or cannot be made.
  kMemory,       ///< The machine could not give the memory asked for (std::bad_alloc).
  kInternal,     ///< A bug in stagecraft.
};

/// Short lower-case name of a kind, used as the message prefix ("model error").
std::string_view to_string(ErrorKind kind);

/// Exit code for a kind: 2 for usage errors, 1 for everything the input caused, 70 for bugs.
int exit_code(ErrorKind kind);

/// An error with a category and a context chain. Context is added outermost-first as the
/// error travels up: `Error(kModel, "cycle").in("node 'x'").in("model.onnx")` prints as
/// "model.onnx: node 'x': cycle".
class Error : public std::exception {
 public:
  Error(ErrorKind kind, std::string message);

  /// Adds one level of context (a file, a node, a field) in front of the existing ones.
  Error& in(std::string context) &;
  Error&& in(std::string context) &&;

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const std::vector<std::string>& context() const { return context_; }

  /// The whole one-line message, context first.
  const char* what() const noexcept override { return line_.c_str(); }

 private:
  void rebuild();

  ErrorKind kind_;
  std::string message_;
  std::vector<std::string> context_;  ///< Outermost first.
  std::string line_;
};

/// Throws an `Error` of `kind` with a formatted message.
template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

/// An exception that is not an `Error` as one: `std::bad_alloc` becomes `kMemory` ("out of
/// memory"), anything else `kind` with the exception's own text.
inline Error error_from(const std::exception& e, ErrorKind kind) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return Error(ErrorKind::kMemory,
                 "out of memory: an allocation failed (the machine or its limits gave no more)");
  }
  return Error(kind, e.what());
}

/// Runs `body`; an `Error` escaping it gets `context` added, and any other exception becomes
/// an `Error` of `kind` with that context. Used at boundaries (a file, a node).
template <typename Body>
decltype(auto) with_context(const std::string& context, ErrorKind kind, Body&& body) {
  try {
    return body();
  } catch (Error& e) {
    e.in(context);
    throw;
  } catch (const std::exception& e) {
    throw error_from(e, kind).in(context);
  }
}

/// Runs a tool's main body, printing any error as one line ("stagec: model error: ...") on
/// stderr and returning the exit code.
template <typename Body>
int run_main(std::string_view tool, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    fmt::print(stderr, "{}: {} error: {}\n", tool, to_string(e.kind()), e.what());
    return exit_code(e.kind());
  } catch (const std::exception& e) {
    Error error = error_from(e, ErrorKind::kInternal);
    fmt::print(stderr, "{}: {} error: {}\n", tool, to_string(error.kind()), error.what());
    return exit_code(error.kind());
  }
}

}  // namespace stagecraft
