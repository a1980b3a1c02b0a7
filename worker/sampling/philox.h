// Philox4x32-10, the counter-based random number generator of Salmon et al.,
// "Parallel Random Numbers: As Easy as 1, 2, 3" (SC'11), as specified by the
// Random123 library: a 128-bit counter and a 64-bit key map to 128 random
// bits through 10 rounds; the same (counter, key) always gives the same bits,
// on every thread and every machine, with no state to carry.
//
// The sampler keys it by the request seed and counts by the position of the
// token being drawn, so a draw never depends on which other sequences share
// the batch or on the order sequences are processed.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>

namespace tessera::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Ten Philox rounds: the Random123 `philox4x32_R(10, ctr, key)`.
PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key);

// Independent uses of randomness for one token position.
enum class RandomStream : uint32_t {
  kSample = 0,             // the sampler's draw
  kSpeculativeAccept = 1,  // acceptance tests of speculative decoding
  kSpeculativeResample = 2,
};

// A uniform double in [0, 1) with 53 random bits, from the Philox block with
// key = seed (low word first) and counter = (position low, position high,
// stream, index).
double UniformFromSeed(uint64_t seed, uint64_t position, RandomStream stream, uint32_t index = 0);

}  // namespace tessera::sampling
