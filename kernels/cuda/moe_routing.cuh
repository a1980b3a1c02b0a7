// The device-side routing of one token (moe_routing.h's math and tie
// rule), shared by MoeRoute (moe_routing.cu) and the fused router
// (moe_router.cu). One CTA of kMoeRouteThreads threads routes one token:
// thread i owns experts i, i + kMoeRouteThreads, ... of the shared score
// arrays, so a chosen expert is struck out by its owner without a barrier;
// every choice is one BlockArgmax (value, then lower index). Included by
// .cu files.
//
// Thread-safety: pure device functions.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/moe_routing.h"

namespace tessera::kernels::cuda::moe_detail {

inline constexpr int kMoeRouteThreads = 128;
inline constexpr float kMoeNegInf = -__builtin_huge_valf();

// The floats of dynamic shared memory RouteOneToken needs.
inline size_t MoeRouteSmemFloats(const MoeRoutingParams& p) {
  const int groups = p.scoring == MoeScoring::kSigmoidGrouped ? p.num_groups : 0;
  return 2 * (static_cast<size_t>(p.num_experts) + groups);
}

// A token's router logits: a[e] (+ b[e] when b is set: the fp32 router's
// hi/lo halves, moe_router.h). Read through L2 (__ldcg): the fused router
// reads logits other CTAs of the same kernel wrote.
struct LogitsRow {
  const float* a;
  const float* b;
  __device__ __forceinline__ float operator[](int e) const {
    return b == nullptr ? __ldcg(a + e) : __ldcg(a + e) + __ldcg(b + e);
  }
};

// Fills score (what weighs) and choice (what chooses) with the softmax of x.
__device__ __forceinline__ void SoftmaxScores(const LogitsRow& x, int n, float* score,
                                              float* choice, float* red) {
  float m = kMoeNegInf;
  for (int e = threadIdx.x; e < n; e += kMoeRouteThreads) m = fmaxf(m, x[e]);
  m = BlockMax(m, red, kMoeNegInf);
  float part = 0.0f;
  for (int e = threadIdx.x; e < n; e += kMoeRouteThreads) {
    score[e] = expf(x[e] - m);
    part += score[e];
  }
  const float sum = BlockSum(part, red);
  for (int e = threadIdx.x; e < n; e += kMoeRouteThreads) {
    score[e] = score[e] / sum;
    choice[e] = score[e];
  }
}

// Thread g scores its groups: the sum of the two largest choice values
// (the first of equal values counts as the larger, as the reference's
// stable top-2 does).
__device__ __forceinline__ void ScoreGroups(const float* choice, int groups, int size,
                                            float* group_score) {
  for (int g = threadIdx.x; g < groups; g += kMoeRouteThreads) {
    float best = kMoeNegInf, second = kMoeNegInf;
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
__device__ __forceinline__ ValueIndex OwnBest(const float* value, int n) {
  ValueIndex best{kMoeNegInf, INT64_MAX};
  for (int i = threadIdx.x; i < n; i += kMoeRouteThreads) {
    const ValueIndex c{value[i], i};
    if (Better(c, best)) best = c;
  }
  return best;
}

// Sigmoid scores, biased choice scores, and choice = -inf for experts of
// the groups that were not kept.
__device__ __forceinline__ void SigmoidGroupedScores(const LogitsRow& x, const MoeRoutingParams& p,
                                                     float* score, float* choice,
                                                     float* group_score, float* kept,
                                                     ValueIndex* vred) {
  const int n = p.num_experts, size = n / p.num_groups;
  for (int e = threadIdx.x; e < n; e += kMoeRouteThreads) {
    score[e] = 1.0f / (1.0f + expf(-x[e]));
    choice[e] = score[e] + (p.correction_bias != nullptr ? p.correction_bias[e] : 0.0f);
  }
  __syncthreads();
  ScoreGroups(choice, p.num_groups, size, group_score);
  __syncthreads();
  // The kept groups are struck out of group_score (-inf) and marked in kept.
  for (int g = threadIdx.x; g < p.num_groups; g += kMoeRouteThreads) kept[g] = 0.0f;
  for (int j = 0; j < p.topk_groups; ++j) {
    const ValueIndex best = BlockArgmax(OwnBest(group_score, p.num_groups), vred);
    if (static_cast<int>(best.index) % kMoeRouteThreads == static_cast<int>(threadIdx.x)) {
      group_score[best.index] = kMoeNegInf;
      kept[best.index] = 1.0f;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n; e += kMoeRouteThreads) {
    if (kept[e / size] == 0.0f) choice[e] = kMoeNegInf;
  }
}

// Softmax scoring of up to kMoeWarpRouteMaxExperts experts by one warp,
// without a block barrier: lane l holds experts l, l + 32, ... in
// registers; the denominator is a warp tree sum; each choice is one
// WarpArgmax (probability, then lower index), the owner lane striking it
// out. The same choices and weights as the block path up to the
// denominator's summation order (an ulp or two).
inline constexpr int kMoeWarpRouteMaxExperts = 256;

__device__ __forceinline__ void WarpSoftmaxRoute(const LogitsRow& x, const MoeRoutingParams& p,
                                                 int32_t* experts, float* weights) {
  constexpr int kPer = kMoeWarpRouteMaxExperts / 32;
  const int lane = threadIdx.x & 31, n = p.num_experts;
  float v[kPer];
  float m = kMoeNegInf;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    v[i] = e < n ? x[e] : kMoeNegInf;
    m = fmaxf(m, v[i]);
  }
  m = WarpMax(m);
  float part = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    v[i] = i * 32 + lane < n ? expf(v[i] - m) : 0.0f;
    part += v[i];
  }
  const float sum = WarpSum(part);
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = i * 32 + lane < n ? v[i] / sum : kMoeNegInf;
  float chosen_sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    ValueIndex own{kMoeNegInf, INT64_MAX};
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const ValueIndex c{v[i], i * 32 + lane};
      if (Better(c, own)) own = c;
    }
    const ValueIndex best = WarpArgmax(own);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (i * 32 + lane == best.index) v[i] = kMoeNegInf;
    }
    if (lane == 0) {
      experts[j] = static_cast<int32_t>(best.index);
      weights[j] = best.value;
      chosen_sum += best.value;
    }
  }
  if (lane == 0 && p.renormalize) {
    for (int j = 0; j < p.top_k; ++j) weights[j] = weights[j] / chosen_sum;
  }
}

// Routes the token whose logits are x: experts[j], weights[j] for j < k.
// Every thread of the CTA calls it; `smem` holds MoeRouteSmemFloats(p)
// floats (dynamic shared memory the caller may reuse before, after a
// barrier).
__device__ __forceinline__ void RouteOneToken(const LogitsRow& x, const MoeRoutingParams& p,
                                              float* smem, int32_t* experts, float* weights) {
  const int n = p.num_experts, k = p.top_k;
  if (p.scoring == MoeScoring::kSoftmax && n <= kMoeWarpRouteMaxExperts) {
    if (threadIdx.x < 32) WarpSoftmaxRoute(x, p, experts, weights);
    return;
  }
  float* score = smem;
  float* choice = score + n;
  float* group_score = choice + n;
  float* kept = group_score + p.num_groups;
  __shared__ float red[33];
  __shared__ ValueIndex vred[32];
  __shared__ int32_t chosen[kMoeMaxTopK];
  const bool sigmoid = p.scoring == MoeScoring::kSigmoidGrouped;
  if (sigmoid) {
    SigmoidGroupedScores(x, p, score, choice, group_score, kept, vred);
  } else {
    SoftmaxScores(x, n, score, choice, red);
  }
  for (int j = 0; j < k; ++j) {
    const ValueIndex best = BlockArgmax(OwnBest(choice, n), vred);
    // Only the owner reads this slot again, so it strikes it out alone.
    if (static_cast<int>(best.index) % kMoeRouteThreads == static_cast<int>(threadIdx.x)) {
      choice[best.index] = kMoeNegInf;
      chosen[j] = static_cast<int32_t>(best.index);
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
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

}  // namespace tessera::kernels::cuda::moe_detail
