#pragma once
/// \file
/// Token streams for language-model training (stagerun --tokens): a file of token ids one after
/// another, read a window at a time with bounded reads (never the whole file, never mmap: a
/// stream may be larger than the process's address space allows).
///
/// Formats, told apart by their first bytes:
///   .npy     a 1-D array of uint16, uint32, int32 or int64 (NumPy's magic "\x93NUMPY");
///   llm.c    a header of 256 little-endian int32 (magic 20240520, version 1: uint16 tokens,
///            then the token count), then the tokens;
///   raw      anything else: the tokens alone (nanoGPT's train.bin), uint16 unless told
///            otherwise (--token-dtype).
///
/// A window is T + 1 consecutive tokens: the model reads tokens [o, o + T), the labels are
/// [o + 1, o + T + 1). Window k starts at o = k * T (windows share their last token with the
/// next one's first), so a stream of N tokens holds floor((N - 1) / T) windows.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace stagecraft::tools {

enum class TokenDtype { kUint16, kUint32, kInt32, kInt64 };

std::string_view token_dtype_name(TokenDtype dtype);
int64_t token_dtype_size(TokenDtype dtype);
/// "uint16" or "uint32" (what --token-dtype takes for a raw file), else nullopt.
std::optional<TokenDtype> raw_token_dtype(std::string_view name);

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

/// Where a stream's tokens lie in its file.
struct TokenFile {
  std::string path;
  std::string format;  ///< "npy", "llm.c" or "raw".
  TokenDtype dtype = TokenDtype::kUint16;
  int64_t data_offset = 0;  ///< Bytes before the first token.
  int64_t count = 0;        ///< Tokens.
};

/// Reads and checks `path`'s header (`raw_dtype`: the dtype of a raw file, --token-dtype; a
/// header that says another is refused). Refuses, with one line naming the file and the
/// numbers (`Error(kFormat)`; `kIo` when it cannot be opened): a .npy of another rank or dtype
/// or shorter than its shape, an llm.c header whose magic, version or count does not match the
/// file's size, a raw file whose size is not a whole number of tokens.
TokenFile open_token_file(const std::string& path, std::optional<TokenDtype> raw_dtype = {});

/// Reads tokens of a TokenFile with pread: each call reads just the tokens asked for.
class TokenReader {
 public:
  explicit TokenReader(TokenFile file);
  ~TokenReader();
  TokenReader(const TokenReader&) = delete;
  TokenReader& operator=(const TokenReader&) = delete;

  const TokenFile& file() const { return file_; }

  /// Tokens [first, first + out.size()) as int64; `Error(kFormat)` naming the file and the
  /// token offset when that is past the end or the read comes back short, and for a token of
  /// a signed dtype below 0 or, when `vocab` > 0, one of `vocab` or more.
  void read(int64_t first, std::span<int64_t> out, int64_t vocab = 0) const;

 private:
  TokenFile file_;
  int fd_ = -1;
};

/// The order of a stream's windows, epoch after epoch: in file order, or (`shuffle`) a
/// permutation drawn per epoch from `seed` and the epoch's number (every window once per epoch,
/// the same for the same seed on every machine: a keyed Feistel network over the window
/// indices, not a standard library's shuffle, whose algorithm is the library's own). Needs no
/// memory per window.
class WindowOrder {
 public:
  WindowOrder(int64_t windows, bool shuffle, uint64_t seed);
  int64_t windows() const { return windows_; }
  /// The window at `index` (0 <= index < windows) of epoch `epoch`.
  int64_t window(int64_t epoch, int64_t index) const;

 private:
  uint64_t permute(uint64_t key, uint64_t x) const;
  int64_t windows_;
  bool shuffle_;
  uint64_t seed_;
  int half_bits_ = 0;  ///< The Feistel halves: the domain is 2^(2 x half_bits) >= windows.
};

/// Where a run is in its stream: the next window is `index` of epoch `epoch`.
struct StreamPosition {
  int64_t epoch = 0;
  int64_t index = 0;
  /// Moves on by `n` windows of `windows` per epoch.
  void advance(int64_t n, int64_t windows);
};

}  // namespace stagecraft::tools
