#pragma once
/// \file
/// The message of the error a test expects a call to throw.

#include <doctest/doctest.h>

#include <string>

#include "runtime/format/error.h"

namespace stagecraft::testing {

/// The message of the Error `body` throws, after checking its kind (fails when none is thrown).
template <typename Body>
std::string error_of(ErrorKind kind, Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    CHECK(e.kind() == kind);
    return e.what();
  }
  FAIL("no error thrown");
  return "";
}

}  // namespace stagecraft::testing
