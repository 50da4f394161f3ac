#pragma once
/// \file
/// The digest a plan's stage weights are checked by (plan.json's stages[k].weights_hash): the
/// compiler hashes the bytes it places (compiler/plan/stage_weights.h), the runtime the bytes it
/// reads (runtime/core/external_weights.h).

#include <cstddef>
#include <cstdint>
#include <string>

namespace stagecraft::plan {

inline constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ULL;  ///< FNV-1a 64-bit offset basis.
inline constexpr uint64_t kFnvPrime = 0x100000001b3ULL;       ///< FNV 64-bit prime.

/// FNV-1a over `n` bytes from `hash` (kFnvBasis to start): plan.json's and the stage files'
/// hashes ("fnv1a64:"), and the fold of WeightsHasher's lanes.
uint64_t fnv1a(uint64_t hash, const unsigned char* bytes, std::size_t n);

/// The digest stage weights are checked by: "fnv1a64x4:<16 hex digits>", FNV-1a over 64-bit
/// little-endian words in four interleaved lanes (so it runs at memory speed), folded with the
/// length. It detects a changed file, not an attacker. Feeding the bytes in any chunking gives
/// the same digest.
class WeightsHasher {
 public:
  void update(const void* data, std::size_t n);
  std::string digest() const;
  int64_t bytes() const { return total_; }

 private:
  void block(const unsigned char* p);
  uint64_t lanes_[4] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL, 0x9e3779b97f4a7c15ULL,
                        0xc2b2ae3d27d4eb4fULL};
  unsigned char pending_[32] = {};
  std::size_t pending_size_ = 0;
  int64_t total_ = 0;
};

}  // namespace stagecraft::plan
