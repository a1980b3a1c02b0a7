// Device-side MoE routing (moe_routing.h): one CTA per token. Thread i owns
// experts i, i + kThreads, ... of the shared score arrays for the whole
// kernel, so a chosen expert can be struck out by its owner without a
// barrier; every choice is one BlockArgmax (value, then lower index).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_routing.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr float kNegInf = -__builtin_huge_valf();

struct RouteArgs {
  const float* logits;
  MoeRoutingParams p;
  int32_t* experts;
  float* weights;
};

// Fills score (what weighs) and choice (what chooses) with the softmax of x.
__device__ void SoftmaxScores(const float* x, int n, float* score, float* choice, float* red) {
  float m = kNegInf;
  for (int e = threadIdx.x; e < n; e += kThreads) m = fmaxf(m, x[e]);
  m = BlockMax(m, red, kNegInf);
  float part = 0.0f;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    score[e] = expf(x[e] - m);
    part += score[e];
  }
  const float sum = BlockSum(part, red);
  for (int e = threadIdx.x; e < n; e += kThreads) {
    score[e] = score[e] / sum;
    choice[e] = score[e];
  }
}

// Thread g scores its groups: the sum of the two largest choice values
// (the first of equal values counts as the larger, as the reference's
// stable top-2 does).
__device__ void ScoreGroups(const float* choice, int groups, int size, float* group_score) {
  for (int g = threadIdx.x; g < groups; g += kThreads) {
    float best = kNegInf, second = kNegInf;
    for (int i = 0; i < size; ++i) {
      const float v = choice[g * size + i];
      if (v > best) {
        second = best;
        best = v;
      } else if (v > second) {
        second = v;
      }
    }
    group_score[g] = best + second;
  }
}

// The best value among slots [0, n) owned by this thread (ties: lower slot).
__device__ ValueIndex OwnBest(const float* value, int n) {
  ValueIndex best{kNegInf, INT64_MAX};
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const ValueIndex c{value[i], i};
    if (Better(c, best)) best = c;
  }
  return best;
}

// Sigmoid scores, biased choice scores, and choice = -inf for experts of
// the groups that were not kept.
__device__ void SigmoidGroupedScores(const float* x, const MoeRoutingParams& p, float* score,
                                     float* choice, float* group_score, float* kept,
                                     ValueIndex* vred) {
  const int n = p.num_experts, size = n / p.num_groups;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    score[e] = 1.0f / (1.0f + expf(-x[e]));
    choice[e] = score[e] + (p.correction_bias != nullptr ? p.correction_bias[e] : 0.0f);
  }
  __syncthreads();
  ScoreGroups(choice, p.num_groups, size, group_score);
  __syncthreads();
  // The kept groups are struck out of group_score (-inf) and marked in kept.
  for (int g = threadIdx.x; g < p.num_groups; g += kThreads) kept[g] = 0.0f;
  for (int j = 0; j < p.topk_groups; ++j) {
    const ValueIndex best = BlockArgmax(OwnBest(group_score, p.num_groups), vred);
    if (static_cast<int>(best.index) % kThreads == static_cast<int>(threadIdx.x)) {
      group_score[best.index] = kNegInf;
      kept[best.index] = 1.0f;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n; e += kThreads) {
    if (kept[e / size] == 0.0f) choice[e] = kNegInf;
  }
}

__global__ void __launch_bounds__(kThreads) MoeRouteKernel(RouteArgs a) {
  extern __shared__ float smem[];
  const MoeRoutingParams& p = a.p;
  const int n = p.num_experts, k = p.top_k;
  float* score = smem;
  float* choice = score + n;
  float* group_score = choice + n;
  float* kept = group_score + p.num_groups;
  __shared__ float red[33];
  __shared__ ValueIndex vred[32];
  __shared__ int32_t chosen[kMoeMaxTopK];
  const float* x = a.logits + static_cast<int64_t>(blockIdx.x) * n;
  const bool sigmoid = p.scoring == MoeScoring::kSigmoidGrouped;
  if (sigmoid) {
    SigmoidGroupedScores(x, p, score, choice, group_score, kept, vred);
  } else {
    SoftmaxScores(x, n, score, choice, red);
  }
  for (int j = 0; j < k; ++j) {
    const ValueIndex best = BlockArgmax(OwnBest(choice, n), vred);
    // Only the owner reads this slot again, so it strikes it out alone.
    if (static_cast<int>(best.index) % kThreads == static_cast<int>(threadIdx.x)) {
      choice[best.index] = kNegInf;
      chosen[j] = static_cast<int32_t>(best.index);
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t* experts = a.experts + static_cast<int64_t>(blockIdx.x) * k;
  float* weights = a.weights + static_cast<int64_t>(blockIdx.x) * k;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    experts[j] = chosen[j];
    weights[j] = score[chosen[j]];
    sum += weights[j];
  }
  if (p.renormalize) {
    const float denominator = sigmoid ? sum + 1e-20f : sum;
    for (int j = 0; j < k; ++j) weights[j] = weights[j] / denominator;
  }
  if (sigmoid) {
    for (int j = 0; j < k; ++j) weights[j] = weights[j] * p.scaling_factor;
  }
}

}  // namespace

absl::Status ValidateMoeRouting(const MoeRoutingParams& p) {
  if (p.num_experts < 1 || p.num_experts > kMoeRoutingMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: num_experts = ", p.num_experts,
                                                   " must be in [1, ", kMoeRoutingMaxExperts, "]"));
  }
  if (p.top_k < 1 || p.top_k > p.num_experts || p.top_k > kMoeMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRoute: top_k = ", p.top_k, " must be in [1, min(num_experts, ", kMoeMaxTopK, ")]"));
  }
  if (p.scoring == MoeScoring::kSoftmax) return absl::OkStatus();
  if (p.num_groups < 1 || p.num_experts % p.num_groups != 0 || p.num_experts / p.num_groups < 2) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: num_groups = ", p.num_groups,
                                                   " must split ", p.num_experts,
                                                   " experts into equal groups of >= 2"));
  }
  if (p.topk_groups < 1 || p.topk_groups > p.num_groups) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: topk_groups = ", p.topk_groups,
                                                   " must be in [1, ", p.num_groups, "]"));
  }
  if (p.top_k > p.topk_groups * (p.num_experts / p.num_groups)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoeRoute: top_k = ", p.top_k, " exceeds the experts of ", p.topk_groups, " groups"));
  }
  return absl::OkStatus();
}

absl::Status MoeRoute(const float* logits, int64_t num_tokens, const MoeRoutingParams& params,
                      int32_t* experts, float* weights, CudaStream stream) {
  if (absl::Status s = ValidateMoeRouting(params); !s.ok()) return s;
  if (num_tokens < 0 || num_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("MoeRoute: num_tokens = ", num_tokens));
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (logits == nullptr || experts == nullptr || weights == nullptr) {
    return absl::InvalidArgumentError("MoeRoute: null pointer");
  }
  const int groups = params.scoring == MoeScoring::kSigmoidGrouped ? params.num_groups : 0;
  const size_t smem = sizeof(float) * 2 * (static_cast<size_t>(params.num_experts) + groups);
  MoeRouteKernel<<<static_cast<unsigned>(num_tokens), kThreads, smem, AsCuda(stream)>>>(
      RouteArgs{logits, params, experts, weights});
  return CheckLastLaunch("MoeRoute");
}

}  // namespace tessera::kernels::cuda
