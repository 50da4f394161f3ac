#pragma once
/// \file
/// The random ops' numbers (RandomNormalLike, RandomUniformLike, RandomNormal, RandomUniform),
/// one element at a time, as plain inline functions the host compiler builds for the CPU backend
/// (runtime/cpu/random.cpp) and nvcc for the CUDA one (runtime/cuda/random_kernels.cu), so both
/// draw the same numbers.
///
/// Element i of a node's output is drawn from (the node's key, i) by Dropout's mixer
/// (dropout_mask.h): the node's key is the run's (KernelArgs::random_key: the training step and
/// microbatch, or an inference run's step and microbatch, mixed with the node's name) mixed with
/// the node's `seed` attribute. A microbatch gets the same numbers on any device, in any split
/// of the model into stages and when its forward is recomputed for the backward (the noise of
/// a VAE's reparameterisation is the one its gradient saw), and other numbers at every step,
/// microbatch and node. It is not NumPy's or PyTorch's generator: the draws agree with theirs
/// in distribution only.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/ops/dropout_mask.h"

namespace stagecraft::rt::ops {

/// The key of one random node in one run: the run's key for the node and its `seed` attribute
/// (a float in ONNX; its bits mixed in, so seed 0 and no seed agree).
inline uint64_t random_node_key(uint64_t random_key, float seed) {
  uint32_t bits = 0;
  std::memcpy(&bits, &seed, sizeof bits);
  if (seed == 0.0f) bits = 0;  // -0 as 0
  return dropout_mix(random_key ^ dropout_mix(0x5eedull ^ bits));
}

/// A uniform number in [0, 1) of 53 bits from the `stream`-th draw for element `index`.
STAGECRAFT_DROPOUT_HD inline double random_unit(uint64_t node_key, int64_t index, int stream) {
  const uint64_t z = dropout_mix(
      node_key ^ dropout_mix(2 * static_cast<uint64_t>(index) + static_cast<uint64_t>(stream)));
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

/// Element `index`'s standard normal number (Box-Muller over two 53-bit uniforms, in double).
STAGECRAFT_DROPOUT_HD inline double random_normal(uint64_t node_key, int64_t index) {
  const double u1 = 1.0 - random_unit(node_key, index, 0);  // (0, 1]: log is finite
  const double u2 = random_unit(node_key, index, 1);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/// The parameters of one random node: normal (mean + scale * N(0, 1)) or uniform (low + (high -
/// low) * U[0, 1)), read from its attributes by `random_params`.
struct RandomParams {
  bool normal = true;
  double a = 0;  ///< mean, or low
  double b = 1;  ///< scale, or high - low
};

/// Element `index`'s number of a node with key `node_key`.
STAGECRAFT_DROPOUT_HD inline double random_value(const RandomParams& p, uint64_t node_key,
                                                 int64_t index) {
  return p.normal ? p.a + p.b * random_normal(node_key, index)
                  : p.a + p.b * random_unit(node_key, index, 0);
}

}  // namespace stagecraft::rt::ops
