#include "runtime/format/weights_hash.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>

namespace stagecraft::plan {

uint64_t fnv1a(uint64_t hash, const unsigned char* bytes, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    hash ^= bytes[i];
    hash *= kFnvPrime;
  }
  return hash;
}

void WeightsHasher::block(const unsigned char* p) {
  uint64_t words[4];
  std::memcpy(words, p, sizeof words);
  for (int lane = 0; lane < 4; ++lane) {
    if constexpr (std::endian::native == std::endian::big) words[lane] = __builtin_bswap64(words[lane]);
    lanes_[lane] = (lanes_[lane] ^ words[lane]) * kFnvPrime;
  }
}

void WeightsHasher::update(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += static_cast<int64_t>(n);
  if (pending_size_ > 0) {
    const std::size_t take = std::min(n, sizeof pending_ - pending_size_);
    std::memcpy(pending_ + pending_size_, p, take);
    pending_size_ += take;
    p += take;
    n -= take;
    if (pending_size_ < sizeof pending_) return;
    block(pending_);
    pending_size_ = 0;
  }
  for (; n >= sizeof pending_; p += sizeof pending_, n -= sizeof pending_) block(p);
  std::memcpy(pending_, p, n);
  pending_size_ = n;
}

std::string WeightsHasher::digest() const {
  uint64_t hash = kFnvBasis;
  auto fold = [&](uint64_t word) {  // little-endian, whatever the host's order
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(word >> (8 * i));
    hash = fnv1a(hash, b, sizeof b);
  };
  for (uint64_t lane : lanes_) fold(lane);
  hash = fnv1a(hash, pending_, pending_size_);
  fold(static_cast<uint64_t>(total_));
  return fmt::format("fnv1a64x4:{:016x}", hash);
}

}  // namespace stagecraft::plan
