#pragma once
/// \file
/// The one rule for a path that a file we did not write names relative to its own folder
/// (an initializer's or a Constant's external data, a checkpoint manifest's `file` entries):
/// it must stay inside that folder and be a plain file we can read without surprises.

#include <string>

namespace stagecraft {

/// Resolves `relative` against `folder` ("" is the current directory). Refuses an empty or
/// absolute path, a `..` component, a symlink anywhere along the path, a path that leaves the
/// folder, a missing file, anything but a regular file (a FIFO would block the reader for
/// ever, a device would read without end) and a file with more than one hard link (a hard link
/// can point anywhere on the file system, and the path check cannot see it). Throws
/// `Error(kFormat)` whose message says why (the caller adds which file and field); returns
/// the resolved path.
std::string resolve_inside_folder(const std::string& folder, const std::string& relative);

}  // namespace stagecraft
