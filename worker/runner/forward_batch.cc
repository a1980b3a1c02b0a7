#include "worker/runner/forward_batch.h"

#include "absl/strings/str_cat.h"

namespace tessera::runner {

absl::Status ValidateTreeParents(const ForwardBatch& b) {
  const int n = b.num_tokens();
  if (b.tree_parents.empty()) return absl::OkStatus();
  if (b.tree_parents.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree_parents has ", b.tree_parents.size(), " entries for ", n, " tokens"));
  }
  if (b.positions.size() != static_cast<size_t>(n) ||
      b.query_start_loc.size() != static_cast<size_t>(b.num_seqs()) + 1 ||
      b.query_start_loc.front() != 0 || b.query_start_loc.back() != n) {
    return absl::InvalidArgumentError("tree_parents with a malformed batch layout");
  }
  std::vector<int32_t> depth;
  for (int i = 0; i < b.num_seqs(); ++i) {
    const int begin = b.query_start_loc[i];
    const int q_len = b.query_start_loc[i + 1] - begin;
    if (q_len < 0 || begin < 0 || begin + q_len > n) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": bad query_start_loc"));
    }
    const int32_t start = b.seq_lens[i] - q_len;
    depth.assign(q_len, 0);
    for (int j = 0; j < q_len; ++j) {
      const int t = begin + j;
      const int32_t p = b.tree_parents[t];
      if (p < -1 || p >= j) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, " (sequence ", i, ", chunk index ", j, "): tree parent ", p,
                         " must be -1 or an earlier token of the chunk"));
      }
      depth[j] = p < 0 ? 0 : depth[p] + 1;
      if (b.positions[t] != start + depth[j]) {
        return absl::InvalidArgumentError(absl::StrCat("token ", t, ": position ", b.positions[t],
                                                       " but its depth in sequence ", i,
                                                       " places it at ", start + depth[j]));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateForwardBatch(const ForwardBatch& b, const BatchLimits& limits) {
  const int n = b.num_tokens();
  const int s = b.num_seqs();
  if (n == 0 || s == 0) return absl::InvalidArgumentError("empty batch");
  if (b.positions.size() != static_cast<size_t>(n) ||
      b.slot_mapping.size() != static_cast<size_t>(n)) {
    return absl::InvalidArgumentError("positions and slot_mapping must have one entry per token");
  }
  if (b.query_start_loc.size() != static_cast<size_t>(s) + 1 || b.query_start_loc[0] != 0 ||
      b.query_start_loc.back() != n) {
    return absl::InvalidArgumentError(
        "query_start_loc must have num_seqs + 1 entries from 0 to num_tokens");
  }
  if (b.block_table_stride < 0 ||
      b.block_tables.size() < static_cast<size_t>(s * b.block_table_stride)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_tables has ", b.block_tables.size(), " entries; expected num_seqs (", s,
                     ") * block_table_stride (", b.block_table_stride, ")"));
  }
  if (!b.tree_parents.empty() && !limits.tree_attention) {
    return absl::InvalidArgumentError(
        "tree_parents set, but this runner has no tree attention; send chains");
  }
  const int64_t bs = limits.block_size;
  for (int i = 0; i < s; ++i) {
    const int q_len = b.query_start_loc[i + 1] - b.query_start_loc[i];
    if (q_len < 0 || q_len > b.seq_lens[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, ": ", q_len, " new tokens but seq_len ", b.seq_lens[i]));
    }
    if (b.seq_lens[i] > limits.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": length ", b.seq_lens[i],
                                                     " exceeds the model's context of ",
                                                     limits.max_position_embeddings));
    }
    const int64_t blocks_needed = (b.seq_lens[i] + bs - 1) / bs;
    if (blocks_needed > b.block_table_stride) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, ": seq_len ", b.seq_lens[i], " needs ", blocks_needed,
                       " blocks; its block table holds ", b.block_table_stride));
    }
    const int32_t* table = b.block_tables.data() + i * b.block_table_stride;
    for (int64_t k = 0; k < blocks_needed; ++k) {
      if (table[k] < 0 || table[k] >= limits.num_kv_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " block ", k, " is ",
                                                       table[k], "; the cache has ",
                                                       limits.num_kv_blocks, " blocks"));
      }
    }
    for (int j = 0; j < q_len; ++j) {
      const int t = b.query_start_loc[i] + j;
      const int32_t pos = b.seq_lens[i] - q_len + j;  // also the logical index of its slot
      if (b.tree_parents.empty() && b.positions[t] != pos) {
        return absl::InvalidArgumentError(absl::StrCat("token ", t, ": position ", b.positions[t],
                                                       " but sequence ", i, " places it at ", pos));
      }
      const int64_t slot = int64_t{table[pos / bs]} * bs + pos % bs;
      if (b.slot_mapping[t] >= 0 && b.slot_mapping[t] != slot) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, ": slot ", b.slot_mapping[t], " but the block table puts ",
                         b.tree_parents.empty() ? "position " : "index ", pos, " at slot ", slot));
      }
    }
  }
  if (auto st = ValidateTreeParents(b); !st.ok()) return st;
  for (int t = 0; t < n; ++t) {
    if (b.token_ids[t] < 0 || b.token_ids[t] >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token ", t, " is ", b.token_ids[t], ": ids must be in [0, ", limits.vocab_size, ")"));
    }
  }
  for (int32_t idx : b.logits_indices) {
    if (idx < 0 || idx >= n) {
      return absl::InvalidArgumentError(absl::StrCat("logits index ", idx, " outside the batch"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera::runner
