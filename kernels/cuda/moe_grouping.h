// Tokens grouped by expert on the GPU, for the MoE expert kernels: from the
// router's expert ids int32 [T, k] (pair p = t * k + j), the rows of every
// expert held here in one "grouped order", computed on the device (no host
// copy, so a step never synchronises and can be captured in a CUDA graph).
//
// Only experts of [first_expert, first_expert + num_experts) are held here
// (expert parallelism); pairs naming other experts get no row. Expert e
// (local index) owns grouped rows [offsets[e], offsets[e + 1]), its pairs in
// ascending pair order (a stable counting sort: a token's rows come in token
// order, whatever the batch).
//
// Every buffer is sized for the worst case (every pair held here), so the
// layout depends only on (max_tokens, top_k, num_experts):
//   offsets    [E + 1]  exclusive prefix of the per-expert row counts
//   tile_start [E + 1]  the same in tiles of kMoeGroupTileRows rows
//                       (ceil(count / tile) per expert): the grouped GEMM's
//                       grid slot y belongs to the expert e with
//                       tile_start[e] <= y < tile_start[e + 1]
//   active     [1 + min(E, T*k)]  active[0] = how many experts have rows;
//                       active[1 + s] = the s-th of them, ascending (the
//                       GEMV's grid slot s)
//   row_token  [T*k]    token of each grouped row
//   pair_row   [T*k]    grouped row of each pair, -1 when not held here
//   counts     [E]      scratch
//
// Thread-safety: enqueues on `stream`; the groups must not be shared by
// concurrent calls.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

// Rows per M tile of the grouped GEMM (moe_grouped_gemm.h).
inline constexpr int kMoeGroupTileRows = 128;

struct MoeGroups {
  int64_t max_tokens = 0;
  int top_k = 0;
  int num_experts = 0;  // held here
  int32_t* offsets = nullptr;
  int32_t* tile_start = nullptr;
  int32_t* active = nullptr;
  int32_t* row_token = nullptr;
  int32_t* pair_row = nullptr;
  int32_t* counts = nullptr;
};

// int32 elements of the groups for these sizes.
int64_t MoeGroupsInts(int64_t max_tokens, int top_k, int num_experts);

// The groups laid out in `base` (device, MoeGroupsInts(...) int32s).
MoeGroups CarveMoeGroups(int32_t* base, int64_t max_tokens, int top_k, int num_experts);

// The grid slots the expert kernels launch for num_tokens tokens: GEMM M
// tiles (ceil(T*k / tile) + min(E, T*k): every expert with rows adds at
// most one partial tile) and GEMV expert slots (min(E, T*k)).
int64_t MoeMaxGemmTiles(int64_t num_tokens, int top_k, int num_experts);
int64_t MoeMaxActiveExperts(int64_t num_tokens, int top_k, int num_experts);

// Groups the pairs of `ids` (device [num_tokens, top_k]) by expert into `g`.
// INVALID_ARGUMENT when num_tokens exceeds g.max_tokens or the sizes are bad.
absl::Status MoeGroupByExpert(const int32_t* ids, int64_t num_tokens, int32_t first_expert,
                              const MoeGroups& g, CudaStream stream);

}  // namespace tessera::kernels::cuda
