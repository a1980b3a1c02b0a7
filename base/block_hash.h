// Content hashes of full KV-cache blocks, for prefix caching.
//
// A block's hash covers its parent block's hash and its token ids, so equal
// hashes mean (with overwhelming probability) equal token prefixes:
//
//   hash(block i) = XXH64(LE64(hash(block i-1)) || LE32(t_0) .. LE32(t_{B-1}),
//                         seed)
//
// where block -1's hash is kRootParentHash, the tokens are the block's B
// token ids as little-endian 32-bit integers, and `seed` tells apart caches
// whose KV differs for the same tokens (another model, an adapter). XXH64 is
// the public xxHash 64-bit algorithm, so the router and other processes can
// compute the same values from token ids; the result does not depend on the
// process, the platform or the build (unlike absl::Hash, which is seeded per
// process).
//
// A hash alone never decides that a cached block may be reused: the block
// manager also compares the block's tokens and its parent's identity (see
// block_manager.h), so a collision costs a cache miss, never wrong KV.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tessera {

using TokenId = int32_t;

// The parent hash used for a sequence's first block.
inline constexpr uint64_t kRootParentHash = 0;

// XXH64 of `size` bytes at `data`.
uint64_t XxHash64(const void* data, size_t size, uint64_t seed);

// The chained hash of one full block (see above).
uint64_t HashBlockTokens(uint64_t parent_hash, absl::Span<const TokenId> tokens, uint64_t seed);

// Hashes of the full blocks of `tokens` (the trailing partial block, if any,
// has none), chained from kRootParentHash.
// REQUIRES: block_size > 0.
void HashFullBlocks(absl::Span<const TokenId> tokens, int block_size, uint64_t seed,
                    std::vector<uint64_t>* hashes);

}  // namespace tessera
