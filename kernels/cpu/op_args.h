// Argument types shared by the reference and the optimized CPU kernels:
// non-owning views of weights and of the paged KV cache, and the argument
// block of paged attention, with their validation.
//
// Layouts (all row-major, fp32 unless stated):
//   WeightMatrix      [rows, cols] of bf16/fp16/fp32, HF nn.Linear layout
//                     [out_features, in_features] and nn.Embedding [vocab, hidden]
//   PagedKvCache      K and V each [num_blocks, block_size, num_kv_heads, head_dim]
//   q (attention)     [num_tokens, num_heads, head_dim], token stride q_token_stride
//   out (attention)   [num_tokens, num_heads * head_dim], contiguous
//
// Thread-safety: plain values; validation functions are pure.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/dtype.h"

namespace tessera::kernels::cpu {

struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// One layer's paged KV cache. The slot of token position p of a sequence is
//   slot = block_table[p / block_size] * block_size + p % block_size
// and the K row of kv head h at that slot starts at
//   k + (slot * num_kv_heads + h) * head_dim      (V likewise).
struct PagedKvCache {
  float* k = nullptr;
  float* v = nullptr;
  int64_t num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;

  int64_t slot_stride() const { return int64_t{num_kv_heads} * head_dim; }
  int64_t num_slots() const { return num_blocks * block_size; }
};

// Paged attention over a batch of sequences, each contributing
// q_len = query_start_loc[s + 1] - query_start_loc[s] new query tokens
// (a prefill chunk, or 1 for decode) and having seq_lens[s] tokens of
// context in the cache *including* the new ones (their K/V must already be
// written with WriteKvCache). The new tokens sit at absolute positions
//   seq_lens[s] - q_len, ..., seq_lens[s] - 1
// and query token i attends to every cached key at position <= its own
// (causal). Query head hq reads kv head hq / (num_heads / num_kv_heads)
// (grouped-query attention). Softmax is over scale * (q . k).
struct PagedAttentionArgs {
  const float* q = nullptr;
  int64_t q_token_stride = 0;  // elements between consecutive tokens of q (>= num_heads*head_dim)
  int num_heads = 0;
  PagedKvCache cache;                         // read only here
  absl::Span<const int32_t> query_start_loc;  // [num_seqs + 1], starts at 0, nondecreasing
  absl::Span<const int32_t> seq_lens;         // [num_seqs]
  absl::Span<const int32_t> block_tables;     // [num_seqs, block_table_stride]
  int64_t block_table_stride = 0;
  float scale = 1.0f;  // usually 1/sqrt(head_dim)
  float* out = nullptr;

  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
  int64_t num_tokens() const { return query_start_loc.empty() ? 0 : query_start_loc.back(); }
};

// OK when the dimensions are consistent, the batch description is well
// formed and every block the batch reads is inside the cache; otherwise
// INVALID_ARGUMENT naming the first problem.
absl::Status ValidatePagedAttention(const PagedAttentionArgs& args);

// OK when every slot is either negative (skipped, e.g. padding) or inside
// the cache.
absl::Status ValidateSlotMapping(absl::Span<const int64_t> slot_mapping, const PagedKvCache& cache);

// OK when every id is in [0, table.rows).
absl::Status ValidateTokenIds(absl::Span<const int32_t> ids, const WeightMatrix& table);

}  // namespace tessera::kernels::cpu
