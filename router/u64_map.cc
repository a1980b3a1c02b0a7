#include "router/u64_map.h"

#include <random>

namespace tessera::router {

uint64_t U64MapSeed() {
  static const uint64_t seed = [] {
    std::random_device rd;
    uint64_t s = (uint64_t{rd()} << 32) ^ rd();
    return s | 1;
  }();
  return seed;
}

}  // namespace tessera::router
