#include "worker/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera::sampling {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

absl::Status CheckInputs(absl::Span<const float> logits, const SamplingParams& params,
                         const TokenCounts& counts) {
  if (logits.empty() || logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits row has ", logits.size(), " entries; expected 1 .. 2^31-1"));
  }
  const int vocab = static_cast<int>(logits.size());
  if (absl::Status s = ValidateSamplingParams(params, vocab); !s.ok()) return s;
  bool any_finite = false;
  for (int i = 0; i < vocab; ++i) {
    const float v = logits[i];
    if (std::isnan(v)) return absl::InvalidArgumentError(absl::StrCat("logits[", i, "] is NaN"));
    if (v == std::numeric_limits<float>::infinity()) {
      return absl::InvalidArgumentError(absl::StrCat("logits[", i, "] is +inf"));
    }
    any_finite |= std::isfinite(v);
  }
  if (!any_finite) {
    return absl::InvalidArgumentError("every logit is -inf: no token can be sampled");
  }
  for (const auto& [token, count] : counts.counts()) {
    if (token < 0 || token >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token ", token,
                                                     " in the sequence history is outside the "
                                                     "vocabulary [0, ",
                                                     vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// Per-thread scratch buffers, reused across calls so that a vocabulary-sized
// row costs no allocation (and no fresh page faults) per token.
struct Workspace {
  std::vector<double> logits;  // penalised, then temperature-scaled
  std::vector<float> weights;  // exp(logit - max) of candidates, by token id
  std::vector<int32_t> cand;   // surviving token ids
};

Workspace& ThreadWorkspace() {
  thread_local Workspace workspace;
  return workspace;
}

// Step 1: penalised logits, in double so that no penalty can overflow.
void PenaliseLogits(absl::Span<const float> logits, const SamplingParams& p,
                    const TokenCounts& counts, std::vector<double>* out) {
  out->assign(logits.begin(), logits.end());
  const double r = p.repetition_penalty;
  for (const auto& [token, count] : counts.counts()) {
    double& l = (*out)[static_cast<size_t>(token)];
    if (r != 1.0 && (count.prompt > 0 || count.output > 0)) l = l > 0 ? l / r : l * r;
    if (count.output > 0) {
      l -= static_cast<double>(p.frequency_penalty) * count.output;
      l -= static_cast<double>(p.presence_penalty);
    }
  }
}

// Ranks token a before token b: higher value, then lower id.
struct Better {
  const double* value;
  bool operator()(int32_t a, int32_t b) const {
    return value[a] > value[b] || (value[a] == value[b] && a < b);
  }
};

int32_t ArgMax(const std::vector<double>& values) {
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Steps 1-6: the distribution step 7 draws from. Weights exp(logit - max)
// are evaluated once per candidate in float (relative error ~1e-7) and
// accumulated in double.
SamplingDistribution Process(absl::Span<const float> logits, const SamplingParams& p,
                             const TokenCounts& counts) {
  Workspace& ws = ThreadWorkspace();
  std::vector<double>& s = ws.logits;
  PenaliseLogits(logits, p, counts, &s);
  if (p.greedy()) return {{ArgMax(s)}, {1.0}};

  const double temperature = p.temperature;
  std::vector<int32_t>& cand = ws.cand;
  cand.clear();
  double max_logit = kNegInf;
  for (size_t i = 0; i < s.size(); ++i) {
    s[i] /= temperature;
    if (s[i] > kNegInf) {
      cand.push_back(static_cast<int32_t>(i));
      max_logit = std::max(max_logit, s[i]);
    }
  }
  const Better better{s.data()};
  bool in_id_order = true;

  // Step 4: top-k, keeping ties with the k-th value.
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size()) {
    std::nth_element(cand.begin(), cand.begin() + (p.top_k - 1), cand.end(), better);
    const double kth = s[cand[p.top_k - 1]];
    std::erase_if(cand, [&](int32_t t) { return s[t] < kth; });
    in_id_order = false;
  }

  // The maximum always survives top-k, so max_logit is still the maximum.
  std::vector<float>& w = ws.weights;
  w.resize(s.size());
  double total = 0;
  for (int32_t t : cand) total += w[t] = std::exp(static_cast<float>(s[t] - max_logit));

  // Step 5: top-p. Sort only as far as needed: the best k first, growing k
  // until the kept prefix is decided.
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * total;
    size_t k = std::min<size_t>(cand.size(), 64);
    while (true) {
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), better);
      double before = 0;  // mass of the tokens ranked before the next one
      size_t keep = 0;
      while (keep < k && before < target) before += w[cand[keep++]];
      if (before >= target || k == cand.size()) {
        cand.resize(keep);
        break;
      }
      k = std::min(cand.size(), k * 8);
    }
    in_id_order = false;
  }

  // Step 6: min-p relative to the most likely survivor (weight 1).
  if (p.min_p > 0.0f) {
    const float min_weight = p.min_p;
    std::erase_if(cand, [&](int32_t t) { return w[t] < min_weight; });
  }

  if (!in_id_order) std::sort(cand.begin(), cand.end());
  SamplingDistribution dist;
  dist.tokens.reserve(cand.size());
  dist.probs.reserve(cand.size());
  total = 0;
  for (int32_t t : cand) {
    if (w[t] <= 0) continue;  // underflowed: probability 0
    dist.tokens.push_back(t);
    dist.probs.push_back(w[t]);
    total += w[t];
  }
  for (double& prob : dist.probs) prob /= total;
  return dist;
}

// log-sum-exp of the raw logits (-inf entries contribute nothing).
double RawLogNormaliser(absl::Span<const float> logits) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float v : logits) max_logit = std::max(max_logit, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(v - max_logit);
  return max_logit + std::log(sum);
}

}  // namespace

void TokenCounts::AddPrompt(absl::Span<const int32_t> tokens) {
  for (int32_t t : tokens) ++counts_[t].prompt;
}

void TokenCounts::AddOutput(int32_t token) { ++counts_[token].output; }

absl::StatusOr<SamplingDistribution> ComputeSamplingDistribution(absl::Span<const float> logits,
                                                                 const SamplingParams& params,
                                                                 const TokenCounts& counts) {
  if (absl::Status s = CheckInputs(logits, params, counts); !s.ok()) return s;
  return Process(logits, params, counts);
}

absl::StatusOr<SampleResult> Sample(absl::Span<const float> logits, const SamplingParams& params,
                                    const TokenCounts& counts, int64_t position) {
  if (absl::Status s = CheckInputs(logits, params, counts); !s.ok()) return s;
  if (position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("position must be >= 0, got ", position));
  }
  const SamplingDistribution dist = Process(logits, params, counts);

  // Step 7: inverse CDF in ascending token id.
  size_t chosen = dist.tokens.size() - 1;
  if (dist.tokens.size() > 1) {
    const double u =
        UniformFromSeed(params.seed, static_cast<uint64_t>(position), RandomStream::kSample);
    double cumulative = 0;
    for (size_t i = 0; i < dist.tokens.size(); ++i) {
      cumulative += dist.probs[i];
      if (u < cumulative) {
        chosen = i;
        break;
      }
    }
  }

  SampleResult result;
  result.token = dist.tokens[chosen];
  result.processed_logprob = static_cast<float>(std::log(dist.probs[chosen]));
  const double log_z = RawLogNormaliser(logits);
  const double chosen_logit = logits[result.token];
  result.logprob = static_cast<float>(chosen_logit - log_z);

  // Rank and the best `top_logprobs` raw tokens (value desc, id asc).
  int32_t above = 0;
  const size_t n = static_cast<size_t>(params.top_logprobs);
  std::vector<int32_t> best;
  best.reserve(n + 1);
  auto raw_better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  for (int32_t t = 0; t < static_cast<int32_t>(logits.size()); ++t) {
    if (raw_better(t, result.token)) ++above;
    if (n == 0) continue;
    if (best.size() == n && !raw_better(t, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), t, raw_better), t);
    if (best.size() > n) best.pop_back();
  }
  result.rank = above + 1;
  for (int32_t t : best) {
    result.top_logprobs.push_back({t, static_cast<float>(logits[t] - log_z)});
  }
  return result;
}

}  // namespace tessera::sampling
