// Mixture-of-experts routing (Op::kMoeRouting): a router's logits -> each
// token's top-k experts and their weights, in fp32, computed as Hugging Face
// transformers 5.17 computes them.
//
// Softmax scoring (Qwen3MoeTopKRouter), per token with logits x[0..E):
//   p = softmax(x)                          (fp32: exp(x - max) / sum)
//   choose the top_k largest p
//   w = p[chosen];  if renormalize: w /= sum(w)
// Sigmoid grouped scoring (Glm4MoeTopkRouter, DeepSeek-V3's noaux_tc):
//   s = sigmoid(x);  c = s + correction_bias     (c only chooses; s weighs)
//   the experts form num_groups groups of E / num_groups consecutive ids;
//   a group's score is the sum of its two largest c
//   keep the topk_groups best groups; choose the top_k largest c among
//   their experts
//   w = s[chosen];  if renormalize: w /= (sum(w) + 1e-20);  w *= scaling_factor
//
// Tie rule (deterministic, as torch.topk on CPU in practice): on equal
// scores the lower expert index (or group index) wins. The chosen experts
// of a token are written in descending order of the score they were chosen
// by (ties by ascending index), with their weights at the same positions.
// transformers returns the softmax router's experts in that order and the
// sigmoid router's unsorted, so compare the latter as sets.
//
// Both the reference and the optimized (`cpu`) entry compute every token
// with the same scalar code; the optimized one splits the tokens over the
// pool, so the two agree bitwise.
//
// Thread-safety: reentrant; outputs of concurrent calls must not overlap.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/cpu_ops.h"

namespace tessera::kernels::cpu {

enum class MoeScoringFunction { kSoftmax, kSigmoidGrouped };

struct MoeRoutingParams {
  MoeScoringFunction scoring = MoeScoringFunction::kSoftmax;
  int num_experts = 0;  // E: columns of the logits
  int top_k = 0;        // experts per token
  bool renormalize = false;
  // Sigmoid grouped scoring only:
  int num_groups = 1;                      // divides E; groups of >= 2 experts
  int topk_groups = 1;                     // 1 <= topk_groups <= num_groups
  float scaling_factor = 1.0f;             // routed_scaling_factor
  const float* correction_bias = nullptr;  // [E], or null for zeros
};

// OK when the parameters define a routing: 1 <= top_k <= E, and for
// sigmoid grouped scoring num_groups divides E into groups of >= 2 experts,
// 1 <= topk_groups <= num_groups and top_k <= topk_groups * group size.
// Otherwise INVALID_ARGUMENT naming the parameter.
absl::Status ValidateMoeRouting(const MoeRoutingParams& params);

// For t < num_tokens: experts[t * top_k + j] and weights[t * top_k + j],
// j < top_k, from logits[t * E .. + E). REQUIRES: ValidateMoeRouting(params)
// is OK; no NaN logits.
void MoeRoute(const CpuContext& ctx, const float* logits, int64_t num_tokens,
              const MoeRoutingParams& params, int32_t* experts, float* weights);

namespace reference {
void MoeRoute(const float* logits, int64_t num_tokens, const MoeRoutingParams& params,
              int32_t* experts, float* weights);
}  // namespace reference

}  // namespace tessera::kernels::cpu
