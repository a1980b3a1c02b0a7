#include "worker/sampling/philox.h"

namespace tessera::sampling {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

inline PhiloxCounter Round(const PhiloxCounter& c, const PhiloxKey& k) {
  uint32_t hi0, lo0, hi1, lo1;
  MulHiLo(kMultiplier0, c[0], &hi0, &lo0);
  MulHiLo(kMultiplier1, c[2], &hi1, &lo1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

PhiloxCounter Philox4x32(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    counter = Round(counter, key);
  }
  return counter;
}

double UniformFromSeed(uint64_t seed, uint64_t position, RandomStream stream, uint32_t index) {
  const PhiloxCounter bits =
      Philox4x32({static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
                  static_cast<uint32_t>(stream), index},
                 {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t mantissa = (static_cast<uint64_t>(bits[0]) << 21) | (bits[1] >> 11);
  return static_cast<double>(mantissa) * 0x1p-53;
}

}  // namespace tessera::sampling
