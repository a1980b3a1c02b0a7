// Mixture-of-experts routing on the GPU (Op::kMoeRouting): router logits
// fp32 [T, E] -> each token's top-k expert ids int32 [T, k] and weights
// fp32 [T, k], computed on the device so that a step never waits for the
// host and can be captured in a CUDA graph.
//
// The math and the tie rule are the CPU reference's (kernels/cpu/
// moe_routing.h), which follows transformers 5.17:
//   softmax: p = softmax(x); the top_k largest p; w = p, / sum(w) if
//     renormalize (Qwen3-MoE).
//   sigmoid grouped: s = sigmoid(x), c = s + correction_bias (c chooses, s
//     weighs); groups of E / num_groups consecutive experts are scored by
//     the sum of their two largest c; the topk_groups best groups are kept
//     and the top_k largest c among their experts chosen; w = s, /
//     (sum(w) + 1e-20) if renormalize, * scaling_factor (GLM-4.5,
//     DeepSeek-V3).
// Equal scores: the lower expert (group) index wins. A token's experts are
// written in descending order of the score that chose them. The weights'
// sums run in the reference's order (j = 0 .. k-1); only the softmax
// denominator is summed in a different (tree) order, and expf may differ
// from the host's by an ulp, so weights agree with the CPU reference to
// about 1e-6 relative and the choices agree unless two scores are that
// close without being equal.
//
// One CTA routes one token (moe_routing.cuh); E <= kMoeRoutingMaxExperts,
// k <= kMoeMaxTopK.
//
// Thread-safety: enqueues on `stream`; concurrent calls must not write
// overlapping outputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"

namespace tessera::kernels::cuda {

inline constexpr int kMoeRoutingMaxExperts = 4096;
inline constexpr int kMoeMaxTopK = 32;

enum class MoeScoring { kSoftmax, kSigmoidGrouped };

struct MoeRoutingParams {
  MoeScoring scoring = MoeScoring::kSoftmax;
  int num_experts = 0;  // E: columns of the logits
  int top_k = 0;
  bool renormalize = false;
  // Sigmoid grouped scoring only:
  int num_groups = 1;                      // divides E into groups of >= 2
  int topk_groups = 1;                     // 1 <= topk_groups <= num_groups
  float scaling_factor = 1.0f;             // routed_scaling_factor
  const float* correction_bias = nullptr;  // device [E] fp32, or null for zeros
};

// OK when the parameters define a routing this kernel runs: 1 <= top_k <=
// min(E, kMoeMaxTopK), E <= kMoeRoutingMaxExperts, and for sigmoid grouped
// scoring equal groups of >= 2 experts, 1 <= topk_groups <= num_groups and
// top_k <= topk_groups * group size. Otherwise INVALID_ARGUMENT.
absl::Status ValidateMoeRouting(const MoeRoutingParams& params);

// For t < num_tokens: experts[t * k + j], weights[t * k + j] from
// logits[t * E .. + E) (all device pointers), plus addend[t * E .. + E)
// where `addend` is set (the fp32 router's two halves, moe_router.h).
// num_tokens == 0 enqueues nothing. REQUIRES: no NaN logits.
absl::Status MoeRoute(const float* logits, int64_t num_tokens, const MoeRoutingParams& params,
                      int32_t* experts, float* weights, CudaStream stream,
                      const float* addend = nullptr);

}  // namespace tessera::kernels::cuda
