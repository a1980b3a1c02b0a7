// ShardPlan: which part of a decoder model one tensor-parallel rank holds,
// Megatron-style, and the start-up checks that decide whether a model can be
// split over N ranks at all.
//
// For rank r of N (H = hidden_size, D = head_dim, I = intermediate_size,
// V = vocab_size):
//   - query heads: num_attention_heads / N consecutive heads per rank;
//   - KV heads: num_key_value_heads / N per rank when N divides them; when
//     there are fewer KV heads than ranks, each KV head is replicated on
//     N / num_key_value_heads ranks and a rank keeps the one KV head its query
//     heads read;
//   - fused QKV and gate/up: column-parallel (each rank holds the rows of
//     q_proj/k_proj/v_proj for its heads and I / N rows of gate/up), so
//     their outputs need no communication;
//   - o_proj and down_proj: row-parallel (each rank holds the matching
//     columns), followed by an all-reduce of the [tokens, H] partial sums;
//     their biases are added by rank 0 only;
//   - embedding and LM head: vocab-parallel, the vocabulary split into N
//     contiguous slices of V / N rows (the first V % N ranks one more): a
//     rank embeds the ids inside its slice, writes zeros for the others, and
//     an all-reduce sums the rows; the LM head computes the rank's slice of
//     logits and a gather assembles them;
//   - norms (and Qwen3's per-head q/k norms) are replicated.
//   - mixture-of-experts layers (MoeParallelism): the router is replicated
//     (every rank routes every token, identically); with kTensor every rank
//     holds all experts, each column-parallel in gate/up and row-parallel in
//     down (moe_intermediate / N of each); with kExpert rank r holds whole
//     experts [r E / N, (r + 1) E / N) and computes only their share of each
//     token's combine. Either way the ranks' partial [tokens, H] outputs are
//     summed by the all-reduce that follows the MLP, which is also how the
//     expert-parallel ranks exchange their tokens' results (every rank has
//     every token after the attention all-reduce, so no dispatch is needed).
//     Shared experts are split like a dense MLP in both modes.
//
// Errors (CheckTensorParallel, INVALID_ARGUMENT naming the model's numbers
// and the fix): N < 1; num_attention_heads not divisible by N;
// num_key_value_heads >= N but not divisible by N; num_key_value_heads < N
// but N not a multiple of it (a rank's query heads would read two KV heads);
// intermediate_size not divisible by N (when a layer is dense); a vocabulary
// smaller than N; with MoE: moe_intermediate_size (kTensor) or the routed
// experts (kExpert) not divisible by N, and the shared experts' width not
// divisible by N. A host
// with fewer CPU cores than ranks is not an error (ranks then share cores).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/config.h"

namespace tessera::parallel {

// A contiguous range [start, start + size).
struct Range {
  int64_t start = 0;
  int64_t size = 0;
  int64_t end() const { return start + size; }
  bool Contains(int64_t i) const { return i >= start && i < start + size; }
};

// How the routed experts of MoE layers are split (--moe_parallel).
enum class MoeParallelism {
  kTensor,  // "tensor": a slice of every expert per rank
  kExpert,  // "expert": whole experts per rank
};
std::string_view MoeParallelismName(MoeParallelism mode);  // "tensor", "expert"
absl::StatusOr<MoeParallelism> ParseMoeParallelism(std::string_view name);

struct ShardPlan {
  int rank = 0;              // 0 .. size - 1
  int size = 1;              // ranks in the group
  Range q_heads;             // query heads of this rank
  Range kv_heads;            // KV heads this rank holds (one, replicated, when KV < N)
  Range intermediate;        // rows of gate/up and columns of down_proj
  Range vocab;               // rows of embed_tokens / lm_head
  bool add_row_bias = true;  // o_proj / down_proj biases (rank 0 only)
  // MoE layers (empty ranges for dense models):
  MoeParallelism moe_parallelism = MoeParallelism::kTensor;
  Range experts;              // routed experts held (global ids)
  Range expert_intermediate;  // rows of each held expert's gate/up, columns of its down
  Range shared_intermediate;  // rows of the shared experts' gate/up, columns of their down

  bool sharded() const { return size > 1; }
  std::string ToString() const;  // "rank 1/2: q heads [2, 4), kv heads [1, 2), ..."
};

// The whole model on one rank (size 1): every range full.
ShardPlan FullPlan(const model::ModelConfig& config);

// OK when `config` can be split over `size` ranks (see the header comment).
absl::Status CheckTensorParallel(const model::ModelConfig& config, int size,
                                 MoeParallelism moe = MoeParallelism::kTensor);

// Rank `rank` of a group of `size`, after CheckTensorParallel.
absl::StatusOr<ShardPlan> PlanShard(const model::ModelConfig& config, int rank, int size,
                                    MoeParallelism moe = MoeParallelism::kTensor);

// KV heads held per rank (the KV-cache footprint of one rank).
int64_t KvHeadsPerRank(const model::ModelConfig& config, int size);

}  // namespace tessera::parallel
