// Prefix block hashes as the router computes them: exactly the workers' own
// hash function (base/block_hash.h, XXH64 chained over little-endian
// token ids), called directly rather than re-implemented, so a hash the
// router computes from a prompt's token ids equals the hash a worker reports
// in its prefix-cache events for the same tokens, block size and seed.
//
// This is the only code in router/ that uses worker/: the router links
// tessera_engine_core for block_hash.cc alone.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tessera::router {

using TokenId = int32_t;

// How a worker hashes its KV blocks: tokens per block (WorkerInfo's
// kv_block_size) and the seed mixed into every hash (the worker's
// prefix_hash_seed; 0 unless configured otherwise).
struct HashScheme {
  int block_size = 16;
  uint64_t seed = 0;

  friend bool operator==(const HashScheme& a, const HashScheme& b) {
    return a.block_size == b.block_size && a.seed == b.seed;
  }
};

// The hashes of the full blocks of `tokens` (a trailing partial block has
// none), chained from the root. Replaces the contents of `hashes`.
// REQUIRES: scheme.block_size > 0.
void ComputeBlockHashes(absl::Span<const TokenId> tokens, const HashScheme& scheme,
                        std::vector<uint64_t>* hashes);

// Checks a worker's stored-event against the router's hash: `token_ids`
// holds scheme.block_size tokens per hash, and hashing them chained from
// `parent_hash` must give `hashes`. FAILED_PRECONDITION, naming the block
// size and seed, when they disagree (the worker uses another block size or
// seed than the router believes, so its events cannot be matched against
// prompts); OK when token_ids is empty (nothing to check).
absl::Status VerifyStoredBlocks(const HashScheme& scheme, uint64_t parent_hash,
                                absl::Span<const uint64_t> hashes,
                                absl::Span<const TokenId> token_ids);

}  // namespace tessera::router
