#pragma once
/// \file
/// What the importer's refusal tests check of a model it must refuse.

#include <doctest/doctest.h>

#include <string>

#include "compiler/import.h"
#include "runtime/format/error.h"

namespace stagecraft::testing {

/// Imports `path` (at batch 2 unless `options` binds the batch or other dims) expecting an Error
/// of `kind` whose one-line message names the file first and contains `needle`.
inline void expect_refused(const std::string& path, ErrorKind kind, const std::string& needle,
                           ImportOptions options = {}) {
  if (!options.batch && options.dims.empty()) options.batch = 2;
  try {
    import_model(path, options);
    FAIL("import of " << path << " succeeded; expected: " << needle);
  } catch (const Error& e) {
    std::string what = e.what();
    INFO(what);
    CHECK(e.kind() == kind);
    CHECK(what.find(path) == 0);
    CHECK(what.find(needle) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
}

}  // namespace stagecraft::testing
