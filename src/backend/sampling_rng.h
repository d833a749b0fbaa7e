// The sampling RNG alone, in plain C++17 with no other include, so device code (nvcc, C++17) shares
// the very function the host sampler uses. Included by sampling.h.
#pragma once
#include <cstdint>

namespace ss::backend {

// The uniform in [0, 1) of a request's draw number `counter`: SplitMix64's output at that index of
// the stream seeded with `seed`, so a draw depends on (seed, counter) alone — not on the batch, the
// step, a preemption or the device. A token's draws are counters 2n and 2n + 1 (n: the number of
// output tokens before it; the second draw only when a grammar refused the first).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline double sampling_uniform(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (counter + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace ss::backend
