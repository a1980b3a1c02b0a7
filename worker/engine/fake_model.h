// FakeModel: a deterministic stand-in for the model runner and sampler, for
// tests of the engine core without weights or kernels.
//
// It simulates a paged KV cache: each computed token's "KV" is a 64-bit value
// derived from the KV of the position before it (read back through the block
// table, as attention would) and the token itself, and is written to the
// token's slot. The next token is a function of the last position's KV. So
// a sampled token depends on the whole prefix exactly as stored in the
// cache: a wrong block table, slot mapping, prefix-cache hit or stale block
// changes the output, and Reference() — the same rule applied to the token
// list directly — exposes it. Run() also rejects writes into blocks that are
// shared or cached, and reads of slots that hold another position's KV.
//
// Thread-safety: not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/engine/block_manager.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/sequence.h"

namespace tessera::engine {

class FakeModel {
 public:
  FakeModel(int num_blocks, int block_size, int vocab_size);

  // Computes the batch's KV and samples one token per needs_logits entry.
  // With `blocks`, also checks that every written block is private to its
  // sequence and not cached. FAILED_PRECONDITION on any inconsistency.
  absl::StatusOr<std::vector<SampledTokens>> Run(const ScheduledBatch& batch,
                                                 const BlockManager* blocks = nullptr);

  // The output the model gives for a request run alone: tokens sampled after
  // prompt + `output` (given up front) until a stop condition, computed
  // straight from the token list.
  static std::vector<TokenId> Reference(absl::Span<const TokenId> prompt,
                                        absl::Span<const TokenId> output,
                                        const SamplingOptions& options, int max_model_len,
                                        int vocab_size);

  // The KV rule and the sampling rule.
  static uint64_t Kv(uint64_t previous_kv, TokenId token, int position);
  static TokenId Sample(uint64_t kv, int vocab_size);
  static constexpr uint64_t kInitialKv = 0x5EEDC0FFEE123457ULL;

 private:
  struct Slot {
    uint64_t kv = 0;
    int position = -1;
  };
  int block_size_;
  int vocab_size_;
  std::vector<Slot> slots_;
};

}  // namespace tessera::engine
