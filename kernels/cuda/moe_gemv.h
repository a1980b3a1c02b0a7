// The decode path of the MoE experts: GEMV-style kernels that read only
// the weights of the experts some token chose, each expert's once per 8 of
// its tokens (from HBM the first time), so the bytes read are those of the
// selected experts.
//
//   MoeGemvGateUp: act[r, n] = silu(bf16(x[tok(r)] . gate_e[n])) *
//                  bf16(x[tok(r)] . up_e[n])  -> bf16 act [rows, I]
//   MoeGemvDown:   y[r, h] = bf16(act[r] . down_e[h])  -> bf16 y [rows, H]
// for every grouped row r of every expert e (moe_grouping.h); fp32 sums;
// gate and up are rounded to bf16 before the SiLU, as the dense path's
// GEMM + SiluMul and transformers do.
//
// One warp computes one output column for up to 8 rows at a time; the
// grid is (columns / 8, MoeMaxActiveExperts) and the CTAs of slots past the
// number of experts with rows exit at once, so an expert with no token
// costs one empty CTA per column block and reads nothing.
//
// Thread-safety: enqueues on `stream`.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/moe_expert_weights.h"
#include "kernels/cuda/moe_grouping.h"

namespace tessera::kernels::cuda {

// x bf16 [num_tokens, H]; act bf16 [g.max_tokens * k, I] (rows past the
// grouped rows untouched). g is the grouping of this step's ids.
absl::Status MoeGemvGateUp(const Bf16* x, int64_t num_tokens, const MoeExpertWeights& w,
                           const MoeGroups& g, Bf16* act, CudaStream stream);

// act as MoeGemvGateUp wrote it; y bf16 [g.max_tokens * k, H].
absl::Status MoeGemvDown(const Bf16* act, int64_t num_tokens, const MoeExpertWeights& w,
                         const MoeGroups& g, Bf16* y, CudaStream stream);

}  // namespace tessera::kernels::cuda
