// ForwardBatch: one engine step's work for the model, in the form every
// backend (CPU now, CUDA later) consumes: the new tokens of a batch of
// sequences flattened into one list, with their positions, the KV-cache slots
// they are written to, and each sequence's block table.
//
// Sequence s contributes tokens [query_start_loc[s], query_start_loc[s+1])
// (a prefill chunk, or 1 token for decode); after this step it has
// seq_lens[s] tokens in the cache, so its new tokens sit at positions
// seq_lens[s] - q_len ... seq_lens[s] - 1. Slot of position p:
// block_table[p / block_size] * block_size + p % block_size.
//
// Token trees (speculative decoding): with tree_parents set, a sequence's
// chunk may branch. Chunk token j names the chunk token it follows
// (tree_parents, local index < j) or -1 for the context cached before the
// chunk; a chain has j - 1. Token j's K/V still goes to its own slot, that
// of logical index seq_len - q_len + j, but it sits at position
// seq_len - q_len + depth(j), where a token following the cached context has
// depth 0 and any other one its parent's depth + 1, and it attends to the
// cached context, its ancestors in the chunk and itself only.
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tessera::runner {

struct ForwardBatch {
  std::vector<int32_t> token_ids;        // [num_tokens]
  std::vector<int32_t> positions;        // [num_tokens]
  std::vector<int64_t> slot_mapping;     // [num_tokens]
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1], starts at 0
  std::vector<int32_t> seq_lens;         // [num_seqs]
  std::vector<int32_t> block_tables;     // [num_seqs, block_table_stride], -1 padded
  int64_t block_table_stride = 0;
  // Token indices (into token_ids) whose logits are returned, in order;
  // usually the last token of each sequence that samples this step.
  std::vector<int32_t> logits_indices;
  // Empty: every chunk is a chain. Otherwise [num_tokens]: each token's
  // parent inside its own chunk (-1 = the cached context). Only runners
  // whose ModelRunner::SupportsTreeAttention() is true accept it.
  std::vector<int32_t> tree_parents;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }

  // Appends one sequence's chunk: `tokens` at positions start..start+n-1,
  // with the sequence's block table. When `want_logits`, the chunk's last
  // token is added to logits_indices. REQUIRES: block_table covers the
  // positions; block_table_stride >= block_table.size() (set it first).
  void AddSequence(const std::vector<int32_t>& tokens, int32_t start,
                   const std::vector<int32_t>& block_table, int block_size, bool want_logits);
};

// What a runner accepts: its model's vocabulary and context, and its KV
// cache's geometry.
struct BatchLimits {
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int block_size = 16;
  int64_t num_kv_blocks = 0;
  // Whether tree_parents may be set (the runner masks attention by them).
  bool tree_attention = false;
};

// OK when `batch` is well formed for a runner with `limits`: one position
// and slot per token; query_start_loc from 0 to num_tokens; every
// sequence's new tokens at the positions its seq_len implies, within the
// context, with a block table that covers them using blocks inside the
// cache and slots that match it (a negative slot skips the KV write); token
// ids in the vocabulary; logits indices inside the batch; tree_parents empty,
// or (limits.tree_attention) one per token, each -1 or an earlier token of
// its chunk, with positions at the depths they imply. Otherwise
// INVALID_ARGUMENT naming the first problem. Runners call it before any
// kernel runs.
absl::Status ValidateForwardBatch(const ForwardBatch& batch, const BatchLimits& limits);

// The tree part of ValidateForwardBatch, for runners that check the rest
// themselves: tree_parents well formed and every token's position at
// seq_len - q_len + its depth (chunks without a tree: + its index).
// REQUIRES: positions, query_start_loc and seq_lens sized consistently.
absl::Status ValidateTreeParents(const ForwardBatch& batch);

inline void ForwardBatch::AddSequence(const std::vector<int32_t>& tokens, int32_t start,
                                      const std::vector<int32_t>& block_table, int block_size,
                                      bool want_logits) {
  if (query_start_loc.empty()) query_start_loc.push_back(0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t pos = start + static_cast<int32_t>(i);
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    slot_mapping.push_back(int64_t{block_table[pos / block_size]} * block_size + pos % block_size);
  }
  query_start_loc.push_back(static_cast<int32_t>(token_ids.size()));
  seq_lens.push_back(start + static_cast<int32_t>(tokens.size()));
  for (int64_t i = 0; i < block_table_stride; ++i) {
    block_tables.push_back(i < static_cast<int64_t>(block_table.size()) ? block_table[i] : -1);
  }
  if (want_logits && !tokens.empty()) logits_indices.push_back(num_tokens() - 1);
}

}  // namespace tessera::runner
