#pragma once
/// \file
/// Dropout's mask in training mode, one element at a time, as plain inline functions that the
/// host compiler builds for the CPU backend (runtime/cpu/elementwise.cpp) and nvcc for the CUDA
/// one (runtime/cuda/elementwise_kernels.cu): both backends keep exactly the same elements.
///
/// Element i of a node's output is kept when a uniform number drawn from (the node's key, i)
/// is at least the ratio. The node's key is the run's (KernelArgs::random_key: the training
/// step and microbatch mixed with the node's name) mixed with the node's `seed` attribute, so
/// the mask is the same for a microbatch on any device, in any split of the model into stages,
/// and when its forward is recomputed, and differs between steps, microbatches and nodes. It is
/// not NumPy's or PyTorch's generator: ONNX's training-mode Dropout cases (which hold NumPy's
/// masks) cannot match, and are skipped with that reason.

#include <cstdint>

#ifdef __CUDACC__
#define STAGECRAFT_DROPOUT_HD __host__ __device__
#else
#define STAGECRAFT_DROPOUT_HD
#endif

namespace stagecraft::rt::ops {

/// splitmix64's finaliser: a bijection of 64-bit keys whose outputs look independent.
STAGECRAFT_DROPOUT_HD inline uint64_t dropout_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The key of one Dropout node's mask in one run: the run's key for the node and its `seed`.
inline uint64_t dropout_node_key(uint64_t random_key, int64_t seed) {
  return dropout_mix(random_key ^ dropout_mix(static_cast<uint64_t>(seed)));
}

/// Whether the element at `index` is kept: a uniform number in [0, 1) of 24 bits (exact in
/// float32, so both backends compare the same values) against `ratio`.
STAGECRAFT_DROPOUT_HD inline bool dropout_keeps(uint64_t node_key, int64_t index, float ratio) {
  const uint64_t z = dropout_mix(node_key ^ dropout_mix(static_cast<uint64_t>(index)));
  const float uniform = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
  return uniform >= ratio;
}

}  // namespace stagecraft::rt::ops
