#include "runtime/format/inside_folder.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "runtime/format/error.h"

namespace stagecraft {

namespace fs = std::filesystem;

std::string resolve_inside_folder(const std::string& folder, const std::string& relative) {
  if (relative.empty()) fail(ErrorKind::kFormat, "the path is empty");
  const fs::path rel(relative);
  if (rel.is_absolute())
    fail(ErrorKind::kFormat, "absolute paths are refused; the file must lie in the folder");
  for (const auto& part : rel)
    if (part == "..") fail(ErrorKind::kFormat, "'..' is refused; the file must lie in the folder");
  // One component at a time, so that no symlink anywhere along the path is followed.
  const fs::path dir = folder.empty() ? fs::path(".") : fs::path(folder);
  fs::path current = dir;
  struct stat st {};
  bool walked = false;
  for (const auto& part : rel) {
    if (part.empty() || part == ".") continue;
    current /= part;
    walked = true;
    if (::lstat(current.c_str(), &st) != 0)
      fail(ErrorKind::kFormat, "file {} does not exist", current.string());
    if (S_ISLNK(st.st_mode))
      fail(ErrorKind::kFormat, "{} is a symlink; symlinks are refused", current.string());
  }
  if (!walked) fail(ErrorKind::kFormat, "the path names the folder itself, not a file");
  std::error_code ec;
  const fs::path canonical_dir = fs::weakly_canonical(dir, ec);
  const fs::path canonical_file = fs::weakly_canonical(current, ec);
  auto [d, f] = std::mismatch(canonical_dir.begin(), canonical_dir.end(), canonical_file.begin(),
                              canonical_file.end());
  if (d != canonical_dir.end()) fail(ErrorKind::kFormat, "the path leaves the folder");
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::kFormat, "{} is not a regular file", current.string());
  if (st.st_nlink > 1)
    fail(ErrorKind::kFormat,
         "{} has {} hard links; hard-linked files are refused (a link can lead anywhere)",
         current.string(), static_cast<unsigned long>(st.st_nlink));
  return current.string();
}

}  // namespace stagecraft
