#pragma once
/// \file
/// Bytes for people, one way for every tool: the compiler's summaries and refusals, stagedump's
/// views and stagerun's report print a figure alike, so one number reads the same everywhere.

#include <string>

namespace stagecraft {

/// "512 B", "3.50 KiB", "12.0 MiB", "1.25 GiB": three significant digits from KiB on.
std::string format_bytes(double bytes);

}  // namespace stagecraft
