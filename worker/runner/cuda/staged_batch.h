// StagedBatch: a step's inputs (token ids, positions, KV slots, query and
// sequence lengths, logits rows, block tables, token-tree masks) packed at
// fixed offsets in one device buffer, so that staging a step is one copy.
//
// Padding (decode graphs run a batch-size bucket): padded tokens sit at
// position 0, read block 0 and write no KV (slot -1); padded sequences have
// one token; their logits are computed and ignored. Token trees: a chunk
// whose tokens branch stages its trunk (the chain every token descends
// from) and, per token past it, a 64-bit ancestor mask; chains stage none.
//
// Staging is one copy from pinned host memory, double-buffered
// (kernels/cuda/pinned_buffer.h): the host fills step N+1's inputs while
// step N's copy may still be queued, and the copy runs asynchronously.
// Tokens whose ids the previous step draws on the device
// (runner::PreviousStepToken) are staged as (token, row) pairs and filled
// on the device by TakePreviousTokens, after the copy and before the step.
//
// Thread-safety: not thread-safe; one runner's step at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/pinned_buffer.h"
#include "worker/runner/forward_batch.h"
#include "worker/runner/model_runner.h"

namespace tessera::runner {

// Largest token tree per chunk past its trunk (one 64-bit mask per token).
inline constexpr int kMaxTreeTokens = 64;

// The trunk of a chunk with these tree parents: the longest chain prefix
// that every token of the chunk descends from; q_len for a chain.
int TreeTrunk(const int32_t* parents, int q_len);

class StagedBatch {
 public:
  struct Limits {
    int64_t max_tokens = 0;
    int max_seqs = 0;
    int64_t max_logits_rows = 0;
    int64_t max_blocks_per_seq = 0;
  };
  static absl::StatusOr<StagedBatch> Create(const Limits& limits);

  // Stages `b` padded to `padded_tokens` tokens and `padded_seqs`
  // sequences, with block tables covering `context` positions; token ids
  // are shifted by -vocab_start (a vocabulary-parallel rank: other ids
  // fall outside its rows). `from_previous` names tokens whose ids
  // TakePreviousTokens fills in. Returns whether a chunk branches.
  // REQUIRES: b fits the limits; padded sizes >= b's; from_previous's
  // token indices inside b and at most max_tokens entries.
  absl::StatusOr<bool> Stage(const ForwardBatch& b, int64_t padded_tokens, int padded_seqs,
                             int context, int block_size, int64_t vocab_start,
                             absl::Span<const PreviousStepToken> from_previous,
                             kernels::cuda::CudaStream stream);

  // Queues, on `stream`, the last Stage's from_previous tokens taking their
  // ids from `drawn` (device, the previous step's draws: an id outside
  // [0, vocab) becomes 0). Nothing when that Stage had none.
  absl::Status TakePreviousTokens(const int32_t* drawn, int64_t vocab,
                                  kernels::cuda::CudaStream stream);

  const int32_t* tokens() const { return At<int32_t>(off_tokens_); }
  const int32_t* positions() const { return At<int32_t>(off_positions_); }
  const int64_t* slots() const { return At<int64_t>(off_slots_); }
  const int32_t* query_start_loc() const { return At<int32_t>(off_qsl_); }
  const int32_t* seq_lens() const { return At<int32_t>(off_seq_lens_); }
  const int32_t* logits_indices() const { return At<int32_t>(off_logits_idx_); }
  const int32_t* block_tables() const { return At<int32_t>(off_block_tables_); }
  int64_t block_table_stride() const { return table_stride_; }
  // The last staged step's tree masks and trunks (valid when it branched).
  const uint64_t* tree_ancestors() const { return At<uint64_t>(off_tree_); }
  const int32_t* tree_trunks() const { return At<int32_t>(off_tree_prefix_); }

 private:
  template <class T>
  T* At(size_t off) const {
    return reinterpret_cast<T*>(static_cast<std::byte*>(device_.data()) + off);
  }

  Limits limits_;
  kernels::cuda::DeviceBuffer device_;
  kernels::cuda::PinnedStaging host_;
  size_t off_tokens_ = 0, off_positions_ = 0, off_slots_ = 0, off_qsl_ = 0, off_seq_lens_ = 0,
         off_logits_idx_ = 0, off_block_tables_ = 0, off_tree_ = 0, off_tree_prefix_ = 0,
         off_patches_ = 0;
  int64_t num_patches_ = 0;  // the last Stage's from_previous pairs
  int64_t table_stride_ = 0;
};

}  // namespace tessera::runner
