#include "router/prefix_hash.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/block_hash.h"

namespace tessera::router {

void ComputeBlockHashes(absl::Span<const TokenId> tokens, const HashScheme& scheme,
                        std::vector<uint64_t>* hashes) {
  HashFullBlocks(tokens, scheme.block_size, scheme.seed, hashes);
}

absl::Status VerifyStoredBlocks(const HashScheme& scheme, uint64_t parent_hash,
                                absl::Span<const uint64_t> hashes,
                                absl::Span<const TokenId> token_ids) {
  if (token_ids.empty()) return absl::OkStatus();
  const size_t bs = static_cast<size_t>(scheme.block_size);
  if (scheme.block_size <= 0 || token_ids.size() != hashes.size() * bs) {
    return absl::FailedPreconditionError(
        absl::StrCat("a stored event carries ", token_ids.size(), " token ids for ", hashes.size(),
                     " blocks, which does not fit the block size ", scheme.block_size,
                     " the router uses for this worker"));
  }
  uint64_t parent = parent_hash;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const uint64_t h = HashBlockTokens(parent, token_ids.subspan(i * bs, bs), scheme.seed);
    if (h != hashes[i]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block hash mismatch at block ", i, " of a stored event: the worker reports ", hashes[i],
          ", the router computes ", h, " with block size ", scheme.block_size, " and seed ",
          scheme.seed, "; the worker hashes with another seed or block size"));
    }
    parent = h;
  }
  return absl::OkStatus();
}

}  // namespace tessera::router
