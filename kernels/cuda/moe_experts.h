// The routed experts of one MoE layer on the GPU (Op::kMoeExperts), from
// the router's choices to the layer's output, without a host
// synchronisation (capturable in a CUDA graph):
//   1. MoeGroupByExpert: the (token, slot) pairs grouped by expert;
//   2. gate/up + SiLU-mul, then down, per expert: the GEMV kernels
//      (moe_gemv.h) for few tokens, the grouped GEMM (moe_grouped_gemm.h)
//      for many;
//   3. MoeCombine: the weighted sum in fp32 (+ shared experts), bf16 out.
// Experts that receive no token read no weights. At one token the
// pair-major path (moe_pair_gemv.h) skips 1. and fuses 3. into the down
// GEMV: two kernels after routing instead of four, the same bits.
//
// The workspace holds the groups and the bf16 intermediates act [T*k, I]
// and y [T*k, H], sized for max_tokens (MoeExpertsWorkspaceBytes).
//
// Thread-safety: enqueues on `stream`; the workspace belongs to one call at
// a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/moe_expert_weights.h"
#include "kernels/cuda/moe_gemv.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_pair_gemv.h"

namespace tessera::kernels::cuda {

enum class MoeExpertsPath { kAuto, kGemvPairs, kGemv, kGroupedGemm };

// kAuto: the pair-major GEMVs up to kMoePairGemvMaxTokens tokens, the
// grouped GEMVs up to kMoeGemvMaxTokens (and for shapes the grouped GEMM
// does not tile), the grouped GEMM above.
inline constexpr int64_t kMoePairGemvMaxTokens = 1;
// kMoeGemvMaxTokens: on an H200 at Qwen3-30B-A3B shapes the grouped GEMV
// took 246 us at 16 tokens against the grouped GEMM's 321, and 547 against
// 513 at 64 (moe_kernels_h200.json); 48 lies between, by interpolation.
inline constexpr int64_t kMoeGemvMaxTokens = 48;

struct MoeExpertsArgs {
  const Bf16* x = nullptr;  // [num_tokens, H], the MLP input
  int64_t num_tokens = 0;
  const int32_t* ids = nullptr;    // [num_tokens, top_k] global expert ids
  const float* weights = nullptr;  // [num_tokens, top_k]
  int top_k = 0;
  int32_t first_expert = 0;  // global id of local expert 0
  MoeExpertWeights experts;
  const Bf16* shared = nullptr;  // [num_tokens, H] shared experts' output, or null
  Bf16* out = nullptr;           // [num_tokens, H]
  void* workspace = nullptr;     // device, 256-byte aligned
  size_t workspace_bytes = 0;
  int64_t max_tokens = 0;  // what the workspace was sized for
  MoeExpertsPath path = MoeExpertsPath::kAuto;
  MoeGemmKernelKind gemm_kernel = MoeGemmKernelKind::kAuto;  // the grouped GEMM's
};

size_t MoeExpertsWorkspaceBytes(int64_t max_tokens, int top_k, const MoeExpertWeights& experts);

// The path kAuto takes for these sizes.
MoeExpertsPath MoeExpertsPathFor(int64_t num_tokens, const MoeExpertWeights& experts);

// INVALID_ARGUMENT for bad shapes, a small workspace or a path that cannot
// run these shapes.
absl::Status MoeExperts(const MoeExpertsArgs& args, CudaStream stream);

}  // namespace tessera::kernels::cuda
