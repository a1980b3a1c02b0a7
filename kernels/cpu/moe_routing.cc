#include "kernels/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera::kernels::cpu {
namespace {

// Scratch of one token's routing, reused across the tokens of one call.
struct TokenScratch {
  std::vector<float> score;   // what weighs: softmax p or sigmoid s
  std::vector<float> choice;  // what chooses: p, or s + bias (-inf outside the kept groups)
  std::vector<float> group_score;
  std::vector<int32_t> order;
};

// The first `k` of ids [0, n) by descending value, ties to the lower id,
// into order[0..k). The comparison is a strict total order, so the result
// does not depend on the sort's implementation.
void TopK(const float* value, int n, int k, std::vector<int32_t>* order) {
  order->resize(n);
  std::iota(order->begin(), order->end(), 0);
  std::partial_sort(order->begin(), order->begin() + k, order->end(),
                    [value](int32_t a, int32_t b) {
                      return value[a] > value[b] || (value[a] == value[b] && a < b);
                    });
}

void SoftmaxScores(const float* x, int n, TokenScratch* s) {
  s->score.resize(n);
  const float max = *std::max_element(x, x + n);
  float sum = 0;
  for (int e = 0; e < n; ++e) {
    s->score[e] = std::exp(x[e] - max);
    sum += s->score[e];
  }
  for (int e = 0; e < n; ++e) s->score[e] /= sum;
  s->choice = s->score;
}

// Sigmoid scores, the biased choice scores, and the choice scores of every
// expert outside the topk_groups best groups set to -inf.
void SigmoidGroupedScores(const float* x, const MoeRoutingParams& p, TokenScratch* s) {
  const int n = p.num_experts, group = n / p.num_groups;
  s->score.resize(n);
  s->choice.resize(n);
  for (int e = 0; e < n; ++e) {
    s->score[e] = 1.0f / (1.0f + std::exp(-x[e]));
    s->choice[e] = s->score[e] + (p.correction_bias ? p.correction_bias[e] : 0.0f);
  }
  s->group_score.resize(p.num_groups);
  for (int g = 0; g < p.num_groups; ++g) {
    TopK(s->choice.data() + g * group, group, 2, &s->order);
    s->group_score[g] = s->choice[g * group + s->order[0]] + s->choice[g * group + s->order[1]];
  }
  TopK(s->group_score.data(), p.num_groups, p.topk_groups, &s->order);
  std::vector<bool> kept(p.num_groups, false);
  for (int j = 0; j < p.topk_groups; ++j) kept[s->order[j]] = true;
  for (int e = 0; e < n; ++e) {
    if (!kept[e / group]) s->choice[e] = -std::numeric_limits<float>::infinity();
  }
}

void RouteToken(const float* x, const MoeRoutingParams& p, TokenScratch* s, int32_t* experts,
                float* weights) {
  const bool sigmoid = p.scoring == MoeScoringFunction::kSigmoidGrouped;
  if (sigmoid) {
    SigmoidGroupedScores(x, p, s);
  } else {
    SoftmaxScores(x, p.num_experts, s);
  }
  TopK(s->choice.data(), p.num_experts, p.top_k, &s->order);
  float sum = 0;
  for (int j = 0; j < p.top_k; ++j) {
    experts[j] = s->order[j];
    weights[j] = s->score[s->order[j]];
    sum += weights[j];
  }
  if (p.renormalize) {
    // The sigmoid router adds 1e-20 so an all-zero row cannot divide by 0.
    const float denominator = sigmoid ? sum + 1e-20f : sum;
    for (int j = 0; j < p.top_k; ++j) weights[j] /= denominator;
  }
  if (sigmoid) {
    for (int j = 0; j < p.top_k; ++j) weights[j] *= p.scaling_factor;
  }
}

void RouteRange(const float* logits, int64_t from, int64_t to, const MoeRoutingParams& p,
                int32_t* experts, float* weights) {
  TokenScratch scratch;
  for (int64_t t = from; t < to; ++t) {
    RouteToken(logits + t * p.num_experts, p, &scratch, experts + t * p.top_k,
               weights + t * p.top_k);
  }
}

}  // namespace

absl::Status ValidateMoeRouting(const MoeRoutingParams& p) {
  if (p.top_k < 1 || p.top_k > p.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe routing: top_k = ", p.top_k, " must be in [1, ", p.num_experts, "]"));
  }
  if (p.scoring == MoeScoringFunction::kSoftmax) return absl::OkStatus();
  if (p.num_groups < 1 || p.num_experts % p.num_groups != 0 || p.num_experts / p.num_groups < 2) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: num_groups = ", p.num_groups,
                                                   " must split ", p.num_experts,
                                                   " experts into equal groups of >= 2"));
  }
  if (p.topk_groups < 1 || p.topk_groups > p.num_groups) {
    return absl::InvalidArgumentError(absl::StrCat("moe routing: topk_groups = ", p.topk_groups,
                                                   " must be in [1, ", p.num_groups, "]"));
  }
  if (p.top_k > p.topk_groups * (p.num_experts / p.num_groups)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moe routing: top_k = ", p.top_k, " exceeds the experts of ", p.topk_groups, " groups"));
  }
  return absl::OkStatus();
}

void MoeRoute(const CpuContext& ctx, const float* logits, int64_t num_tokens,
              const MoeRoutingParams& params, int32_t* experts, float* weights) {
  auto run = [&](int64_t from, int64_t to) {
    RouteRange(logits, from, to, params, experts, weights);
  };
  if (ctx.pool == nullptr) {
    run(0, num_tokens);
  } else {
    ctx.pool->ParallelFor(num_tokens, 16, run);
  }
}

namespace reference {
void MoeRoute(const float* logits, int64_t num_tokens, const MoeRoutingParams& params,
              int32_t* experts, float* weights) {
  RouteRange(logits, 0, num_tokens, params, experts, weights);
}
}  // namespace reference

}  // namespace tessera::kernels::cpu
