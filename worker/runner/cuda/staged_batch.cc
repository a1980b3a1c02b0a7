#include "worker/runner/cuda/staged_batch.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/token_patch.h"
#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::runner {

int TreeTrunk(const int32_t* parents, int q_len) {
  int chain = 0;
  while (chain < q_len && parents[chain] == chain - 1) ++chain;
  if (chain == q_len) return q_len;
  // attach[t]: t's first ancestor inside the chain prefix (-1: the context).
  std::vector<int> attach(static_cast<size_t>(q_len));
  int trunk = chain;
  for (int t = chain; t < q_len; ++t) {
    const int parent = parents[t];
    attach[t] = parent < chain ? parent : attach[parent];
    trunk = std::min(trunk, attach[t] + 1);
  }
  return trunk;
}

absl::StatusOr<StagedBatch> StagedBatch::Create(const Limits& limits) {
  StagedBatch s;
  s.limits_ = limits;
  const int64_t T = limits.max_tokens, S = limits.max_seqs;
  // 8-byte aligned sections; the tree masks and trunks follow the used part
  // of the block tables (Stage places them), so the end leaves room for both.
  auto align8 = [](size_t n) { return (n + 7) & ~size_t{7}; };
  size_t off = 0;
  s.off_tokens_ = off;
  off = align8(off + T * sizeof(int32_t));
  s.off_positions_ = off;
  off = align8(off + T * sizeof(int32_t));
  s.off_slots_ = off;
  off = align8(off + T * sizeof(int64_t));
  s.off_qsl_ = off;
  off = align8(off + (S + 1) * sizeof(int32_t));
  s.off_seq_lens_ = off;
  off = align8(off + S * sizeof(int32_t));
  s.off_logits_idx_ = off;
  off = align8(off + limits.max_logits_rows * sizeof(int32_t));
  s.off_block_tables_ = off;
  off = align8(off + S * limits.max_blocks_per_seq * sizeof(int32_t));
  off += T * sizeof(uint64_t) + align8(S * sizeof(int32_t)) + 8;
  // The previous-step pairs follow the tree sections (Stage places them).
  off += T * 2 * sizeof(int32_t) + 8;
  absl::StatusOr<kernels::cuda::PinnedStaging> host = kernels::cuda::PinnedStaging::Create(off);
  if (!host.ok()) return host.status();
  s.host_ = std::move(*host);
  absl::StatusOr<kernels::cuda::DeviceBuffer> d = AllocateDevice(off, "batch inputs");
  if (!d.ok()) return d.status();
  s.device_ = std::move(*d);
  return s;
}

absl::StatusOr<bool> StagedBatch::Stage(const ForwardBatch& b, int64_t padded_tokens,
                                        int padded_seqs, int context, int block_size,
                                        int64_t vocab_start,
                                        absl::Span<const PreviousStepToken> from_previous,
                                        kernels::cuda::CudaStream stream) {
  absl::StatusOr<std::byte*> next = host_.Next();
  if (!next.ok()) return next.status();
  std::byte* base = *next;
  auto put = [&](size_t off, const void* src, size_t bytes) {
    std::memcpy(base + off, src, bytes);
  };
  const int n = b.num_tokens(), s = b.num_seqs();
  put(off_tokens_, b.token_ids.data(), n * sizeof(int32_t));
  put(off_positions_, b.positions.data(), n * sizeof(int32_t));
  put(off_slots_, b.slot_mapping.data(), n * sizeof(int64_t));
  put(off_qsl_, b.query_start_loc.data(), (s + 1) * sizeof(int32_t));
  put(off_seq_lens_, b.seq_lens.data(), s * sizeof(int32_t));
  const int64_t r = static_cast<int64_t>(b.logits_indices.size());
  put(off_logits_idx_, b.logits_indices.data(),
      std::min(r, limits_.max_logits_rows) * sizeof(int32_t));
  int32_t* tables = reinterpret_cast<int32_t*>(base + off_block_tables_);
  // The staged table covers `context` positions (the step's longest
  // sequence, or the graph bucket's bound), not the model's whole context.
  const int64_t stride =
      std::min<int64_t>(limits_.max_blocks_per_seq, (context + block_size - 1) / block_size);
  table_stride_ = stride;
  const int64_t copy = std::min<int64_t>(stride, b.block_table_stride);
  for (int i = 0; i < s; ++i) {
    std::memcpy(tables + i * stride, b.block_tables.data() + i * b.block_table_stride,
                copy * sizeof(int32_t));
    std::fill(tables + i * stride + copy, tables + (i + 1) * stride, 0);
  }
  int32_t* tokens = reinterpret_cast<int32_t*>(base + off_tokens_);
  int32_t* positions = reinterpret_cast<int32_t*>(base + off_positions_);
  int64_t* slots = reinterpret_cast<int64_t*>(base + off_slots_);
  int32_t* qsl = reinterpret_cast<int32_t*>(base + off_qsl_);
  int32_t* seq_lens = reinterpret_cast<int32_t*>(base + off_seq_lens_);
  int32_t* logits_idx = reinterpret_cast<int32_t*>(base + off_logits_idx_);
  if (vocab_start != 0) {
    for (int t = 0; t < n; ++t) tokens[t] -= static_cast<int32_t>(vocab_start);
  }
  for (int64_t t = n; t < padded_tokens; ++t) {
    tokens[t] = 0;
    positions[t] = 0;
    slots[t] = -1;
  }
  for (int i = s; i < padded_seqs; ++i) {
    qsl[i + 1] = qsl[i] + 1;
    seq_lens[i] = 1;
    std::fill(tables + i * stride, tables + (i + 1) * stride, 0);
  }
  if (padded_seqs > s) {
    for (int i = 0; i < padded_seqs; ++i) logits_idx[i] = i;
  }
  // Only the used prefix of the block-table section is copied.
  size_t bytes = off_block_tables_ + static_cast<size_t>(padded_seqs) * stride * sizeof(int32_t);
  bool tree = false;
  for (int i = 0; i < s && !b.tree_parents.empty() && !tree; ++i) {
    for (int t = b.query_start_loc[i]; t < b.query_start_loc[i + 1]; ++t) {
      tree |= b.tree_parents[t] != t - b.query_start_loc[i] - 1;
    }
  }
  if (tree) {
    // Per chunk its trunk P, and per token past the trunk its ancestor
    // mask: bit j = chunk token P + j is the token or one of its ancestors.
    // Trunk tokens, and chunks that do not branch (P = q_len), are causal
    // (all ones).
    off_tree_ = (bytes + 7) & ~size_t{7};
    off_tree_prefix_ = off_tree_ + static_cast<size_t>(n) * sizeof(uint64_t);
    uint64_t* masks = reinterpret_cast<uint64_t*>(base + off_tree_);
    int32_t* trunks = reinterpret_cast<int32_t*>(base + off_tree_prefix_);
    for (int i = 0; i < s; ++i) {
      const int begin = b.query_start_loc[i], q_len = b.query_start_loc[i + 1] - begin;
      const int trunk = TreeTrunk(b.tree_parents.data() + begin, q_len);
      trunks[i] = trunk;
      for (int j = 0; j < q_len; ++j) {
        const int32_t parent = b.tree_parents[begin + j];
        masks[begin + j] = j < trunk ? ~uint64_t{0}
                                     : (parent < trunk ? uint64_t{0} : masks[begin + parent]) |
                                           (uint64_t{1} << (j - trunk));
      }
    }
    bytes = off_tree_prefix_ + static_cast<size_t>(s) * sizeof(int32_t);
  }
  num_patches_ = static_cast<int64_t>(from_previous.size());
  if (num_patches_ > 0) {
    off_patches_ = (bytes + 7) & ~size_t{7};
    int32_t* pairs = reinterpret_cast<int32_t*>(base + off_patches_);
    for (const PreviousStepToken& p : from_previous) {
      *pairs++ = p.token_index;
      *pairs++ = p.row;
    }
    bytes = off_patches_ + static_cast<size_t>(num_patches_) * 2 * sizeof(int32_t);
  }
  if (absl::Status st = host_.CopyToDevice(device_.data(), bytes, stream); !st.ok()) return st;
  return tree;
}

absl::Status StagedBatch::TakePreviousTokens(const int32_t* drawn, int64_t vocab,
                                             kernels::cuda::CudaStream stream) {
  if (num_patches_ == 0) return absl::OkStatus();
  return kernels::cuda::PatchTokensFromPrevious(
      At<int32_t>(off_tokens_), drawn, At<int32_t>(off_patches_), num_patches_, vocab, stream);
}

}  // namespace tessera::runner
