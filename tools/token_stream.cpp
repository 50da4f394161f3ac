// Token streams (token_stream.h): the formats' headers, bounded reads, the windows' order.
#include "tools/token_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "runtime/core/npy_header.h"
#include "runtime/format/error.h"

namespace stagecraft::tools {

std::string_view token_dtype_name(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint16: return "uint16";
    case TokenDtype::kUint32: return "uint32";
    case TokenDtype::kInt32: return "int32";
    case TokenDtype::kInt64: return "int64";
  }
  return "?";
}

int64_t token_dtype_size(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::kUint16: return 2;
    case TokenDtype::kUint32: return 4;
    case TokenDtype::kInt32: return 4;
    case TokenDtype::kInt64: return 8;
  }
  return 0;
}

std::optional<TokenDtype> raw_token_dtype(std::string_view name) {
  if (name == "uint16") return TokenDtype::kUint16;
  if (name == "uint32") return TokenDtype::kUint32;
  return std::nullopt;
}

namespace {

// The file's first `n` bytes (fewer when it is shorter).
std::vector<unsigned char> head(const std::string& path, size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open ({})", path, std::strerror(errno));
  std::vector<unsigned char> bytes(n);
  ssize_t got = ::pread(fd, bytes.data(), n, 0);
  ::close(fd);
  if (got < 0) fail(ErrorKind::kIo, "{}: cannot read ({})", path, std::strerror(errno));
  bytes.resize(static_cast<size_t>(got));
  return bytes;
}

int32_t le32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
}

// A dtype given for a raw file against the one a header says.
void check_said(const TokenFile& f, std::optional<TokenDtype> raw_dtype) {
  if (raw_dtype && *raw_dtype != f.dtype)
    fail(ErrorKind::kUsage, "--token-dtype {}: {} is {} (its {} header says so)",
         token_dtype_name(*raw_dtype), f.path, token_dtype_name(f.dtype), f.format);
}

TokenFile open_npy(TokenFile f) {
  const rt::NpyArray array = rt::read_npy_header(f.path);
  switch (array.dtype) {
    case DType::kUInt16: f.dtype = TokenDtype::kUint16; break;
    case DType::kUInt32: f.dtype = TokenDtype::kUint32; break;
    case DType::kInt32: f.dtype = TokenDtype::kInt32; break;
    case DType::kInt64: f.dtype = TokenDtype::kInt64; break;
    default:
      fail(ErrorKind::kFormat,
           "{}: a token stream .npy must be uint16, uint32, int32 or int64, not {}", f.path,
           dtype_name(array.dtype));
  }
  if (array.shape.size() != 1)
    fail(ErrorKind::kFormat, "{}: a token stream .npy must be 1-D, not {}{} (rank {})", f.path,
         dtype_name(array.dtype), rt::shape_string(array.shape), array.shape.size());
  f.format = "npy";
  f.data_offset = array.data_offset;
  f.count = array.shape[0];
  return f;
}

TokenFile open_llmc(TokenFile f, const std::vector<unsigned char>& bytes, int64_t size) {
  f.format = "llm.c";
  if (static_cast<int64_t>(bytes.size()) < kLlmcHeaderBytes)
    fail(ErrorKind::kFormat, "{}: llm.c header (magic {}) of {} bytes; it needs {}", f.path,
         kLlmcMagic, bytes.size(), kLlmcHeaderBytes);
  const int32_t version = le32(bytes.data() + 4), count = le32(bytes.data() + 8);
  if (version != 1)
    fail(ErrorKind::kFormat,
         "{}: llm.c header version {} at byte 4; only version 1 (uint16 tokens) is read",
         f.path, version);
  f.dtype = TokenDtype::kUint16;
  f.data_offset = kLlmcHeaderBytes;
  f.count = count;
  const int64_t need = kLlmcHeaderBytes + 2 * static_cast<int64_t>(count);
  if (count < 0 || need != size)
    fail(ErrorKind::kFormat,
         "{}: llm.c header says {} tokens (at byte 8): {} bytes with the header, but the file "
         "has {}",
         f.path, count, need, size);
  return f;
}

}  // namespace

TokenFile open_token_file(const std::string& path, std::optional<TokenDtype> raw_dtype) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(ErrorKind::kIo, "{}: no such file", path);
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec) fail(ErrorKind::kIo, "{}: cannot read its size ({})", path, ec.message());
  const std::vector<unsigned char> bytes = head(path, kLlmcHeaderBytes);
  TokenFile f;
  f.path = path;
  if (bytes.size() >= 6 && std::memcmp(bytes.data(), "\x93NUMPY", 6) == 0) {
    f = open_npy(f);
  } else if (bytes.size() >= 4 && le32(bytes.data()) == kLlmcMagic) {
    f = open_llmc(f, bytes, size);
  } else {
    f.format = "raw";
    f.dtype = raw_dtype.value_or(TokenDtype::kUint16);
    const int64_t width = token_dtype_size(f.dtype);
    if (size % width != 0)
      fail(ErrorKind::kFormat,
           "{}: {} bytes is not a whole number of {} tokens ({} bytes each; a raw token file "
           "is the tokens alone)",
           path, size, token_dtype_name(f.dtype), width);
    f.count = size / width;
    return f;
  }
  check_said(f, raw_dtype);
  return f;
}

TokenReader::TokenReader(TokenFile file) : file_(std::move(file)) {
  fd_ = ::open(file_.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(ErrorKind::kIo, "{}: cannot open ({})", file_.path, std::strerror(errno));
}

TokenReader::~TokenReader() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenReader::read(int64_t first, std::span<int64_t> out, int64_t vocab) const {
  const auto n = static_cast<int64_t>(out.size());
  if (first < 0 || n > file_.count - first)
    fail(ErrorKind::kFormat, "{}: tokens [{}, {}) are past its end ({} tokens)", file_.path,
         first, first + n, file_.count);
  const int64_t width = token_dtype_size(file_.dtype);
  std::vector<unsigned char> bytes(static_cast<size_t>(n * width));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::pread(fd_, bytes.data() + done, bytes.size() - done,
                                file_.data_offset + first * width + static_cast<int64_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail(ErrorKind::kFormat, "{}: reading tokens [{}, {}) came back short at byte {} ({})",
           file_.path, first, first + n,
           file_.data_offset + first * width + static_cast<int64_t>(done),
           got < 0 ? std::strerror(errno) : "the file shrank");
    done += static_cast<size_t>(got);
  }
  static_assert(std::endian::native == std::endian::little, "token files are little-endian");
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* p = bytes.data() + i * width;
    int64_t token = 0;
    switch (file_.dtype) {
      case TokenDtype::kUint16: token = p[0] | (p[1] << 8); break;
      case TokenDtype::kUint32: token = static_cast<uint32_t>(le32(p)); break;
      case TokenDtype::kInt32: token = le32(p); break;
      case TokenDtype::kInt64: std::memcpy(&token, p, 8); break;
    }
    if (token < 0 || (vocab > 0 && token >= vocab))
      fail(ErrorKind::kFormat, "{}: token {} at token offset {} (byte {}) is {}", file_.path,
           token, first + i, file_.data_offset + (first + i) * width,
           token < 0 ? std::string("negative")
                     : fmt::format("past the model's vocabulary of {} (the embedding's rows)",
                                   vocab));
    out[static_cast<size_t>(i)] = token;
  }
}

namespace {

// splitmix64's finalizer: a good 64-bit mix for the Feistel rounds and the keys.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

WindowOrder::WindowOrder(int64_t windows, bool shuffle, uint64_t seed)
    : windows_(windows), shuffle_(shuffle), seed_(seed) {
  if (windows <= 0) fail(ErrorKind::kInternal, "WindowOrder of {} windows", windows);
  // Halves of h bits each: 2^(2h) >= windows, so cycle walking takes under 4 tries on average.
  const int bits = windows > 1 ? std::bit_width(static_cast<uint64_t>(windows - 1)) : 1;
  half_bits_ = (bits + 1) / 2;
}

uint64_t WindowOrder::permute(uint64_t key, uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (uint64_t round = 0; round < 4; ++round) {
    const uint64_t f = mix(key ^ mix(right + (round << 56))) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t WindowOrder::window(int64_t epoch, int64_t index) const {
  if (index < 0 || index >= windows_)
    fail(ErrorKind::kInternal, "window {} of {}", index, windows_);
  if (!shuffle_) return index;
  const uint64_t key = mix(seed_ ^ mix(static_cast<uint64_t>(epoch)));
  // A bijection of [0, 2^(2h)): walking its cycle from `index` until it lands in [0, windows)
  // is a bijection of [0, windows).
  uint64_t x = permute(key, static_cast<uint64_t>(index));
  while (x >= static_cast<uint64_t>(windows_)) x = permute(key, x);
  return static_cast<int64_t>(x);
}

void StreamPosition::advance(int64_t n, int64_t windows) {
  index += n;
  epoch += index / windows;
  index %= windows;
}

}  // namespace stagecraft::tools
