// The one-token decode path of the MoE experts: GEMVs over the (token,
// slot) pairs as the router listed them, without grouping by expert, and
// the down projection fused with the combine. Three kernels per layer
// (routing, gate/up, down + combine) instead of five: at batch 1 the
// launch boundaries cost about as much as the grouping saves.
//
//   MoePairGemvGateUp:      act[p, n] for every pair p = t * k + j whose
//                           expert is held here (the same row math as
//                           MoeGemvGateUp), bf16 act [T*k, I]
//   MoePairGemvDownCombine: out[t] = sum over t's held pairs, in ascending
//                           expert order, of w * bf16(act[p] . down_e) (+
//                           shared[t]), bf16 [T, H]
// The results equal the grouped path's (moe_gemv.h + moe_combine.h) bit for
// bit: the same per-row sums in the same order.
//
// Each pair reads its expert's weights, so two tokens that chose one expert
// read it twice (from L2 when their CTAs run together, else from HBM):
// exact bytes at T = 1, the grouped GEMV's better from a few tokens up
// (MoeExperts picks by kMoePairGemvMaxTokens).
//
// Thread-safety: enqueues on `stream`; out must not overlap the inputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/moe_expert_weights.h"

namespace tessera::kernels::cuda {

// Load schedules, measured on an H200 at T = 1 (moe_kernels_h200.json): the
// gate/up kernel's loops unrolled twice (14.4 us, against 16.6 with its
// first 2048 columns prefetched); the down kernel issues 4 experts' first
// 768 columns (12 16-byte loads per lane) before the first FMA (14.9 us,
// against 17.3 unrolled and 20.4 with 8 experts per pass).

struct MoePairGemvArgs {
  const Bf16* x = nullptr;  // [num_tokens, H]
  int64_t num_tokens = 0;
  const int32_t* ids = nullptr;    // [num_tokens, top_k] global expert ids
  const float* weights = nullptr;  // [num_tokens, top_k]
  int top_k = 0;
  int32_t first_expert = 0;  // global id of local expert 0
  MoeExpertWeights experts;
  const Bf16* shared = nullptr;  // [num_tokens, H] or null
  Bf16* act = nullptr;           // [num_tokens * top_k, I] scratch
  Bf16* out = nullptr;           // [num_tokens, H]
};

absl::Status MoePairGemvGateUp(const MoePairGemvArgs& args, CudaStream stream);
absl::Status MoePairGemvDownCombine(const MoePairGemvArgs& args, CudaStream stream);

}  // namespace tessera::kernels::cuda
