#include "worker/spec/verifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "worker/sampling/philox.h"

namespace tessera::spec {
namespace {

// q(token) for a sparse distribution, normalized by its total.
class SparseQ {
 public:
  explicit SparseQ(const DraftDistribution& d) {
    double total = 0;
    for (float p : d.probs) total += p;
    for (size_t i = 0; i < d.tokens.size(); ++i) probs_[d.tokens[i]] += d.probs[i] / total;
  }
  double operator()(TokenId t) const {
    auto it = probs_.find(t);
    return it == probs_.end() ? 0.0 : it->second;
  }

 private:
  absl::flat_hash_map<TokenId, double> probs_;
};

// Inverse CDF over `weights` (not necessarily normalized) in the given order.
size_t Draw(const std::vector<double>& weights, double total, double u) {
  double target = u * total, c = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    c += weights[i];
    if (target < c) return i;
  }
  // Rounding: the last token with positive weight.
  for (size_t i = weights.size(); i-- > 0;) {
    if (weights[i] > 0) return i;
  }
  return weights.size() - 1;
}

}  // namespace

absl::Status ValidateDraft(const Draft& draft, int64_t vocab) {
  for (size_t i = 0; i < draft.tokens.size(); ++i) {
    if (draft.tokens[i] < 0 || draft.tokens[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft token ", i, " is ", draft.tokens[i], ", outside [0, ", vocab, ")"));
    }
  }
  if (!draft.parents.empty() && draft.parents.size() != draft.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("parents has ", draft.parents.size(),
                                                   " entries for ", draft.tokens.size(),
                                                   " draft tokens; expected none or one each"));
  }
  for (size_t i = 0; i < draft.parents.size(); ++i) {
    const int32_t p = draft.parents[i];
    if (p < -1 || p >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("draft node ", i, " has parent ", p,
                                                     "; a parent must be -1 or an earlier node"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (draft.parents[j] == p && draft.tokens[j] == draft.tokens[i]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "draft nodes ", j, " and ", i, " are siblings with the same token ", draft.tokens[i]));
      }
    }
  }
  if (draft.q.empty()) return absl::OkStatus();
  if (draft.q.size() != draft.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("q has ", draft.q.size(), " entries for ",
                                                   draft.tokens.size(), " draft tokens"));
  }
  for (size_t i = 0; i < draft.q.size(); ++i) {
    const DraftDistribution& d = draft.q[i];
    if (d.tokens.size() != d.probs.size() || d.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("q[", i, "] is malformed"));
    }
    double total = 0, own = 0;
    for (size_t j = 0; j < d.tokens.size(); ++j) {
      if (d.tokens[j] < 0 || d.tokens[j] >= vocab || !std::isfinite(d.probs[j]) || d.probs[j] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("q[", i, "] has a bad entry"));
      }
      total += d.probs[j];
      if (d.tokens[j] == draft.tokens[i]) own += d.probs[j];
    }
    if (!(total > 0) || !(own > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("q[", i, "] gives its draft token no probability"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<VerifyResult> VerifyChain(absl::Span<const float> logits, int64_t vocab,
                                         absl::Span<const TokenId> draft,
                                         absl::Span<const DraftDistribution> q,
                                         const sampling::SamplingParams& params,
                                         sampling::TokenCounts* counts, int64_t position) {
  const size_t k = draft.size();
  if (vocab <= 0 || logits.size() != (k + 1) * static_cast<size_t>(vocab)) {
    return absl::InvalidArgumentError(absl::StrCat("verification needs ", k + 1, " logits rows of ",
                                                   vocab, ", got ", logits.size(), " values"));
  }
  if (!q.empty() && q.size() != k) {
    return absl::InvalidArgumentError("q must be empty or one entry per draft token");
  }
  VerifyResult result;
  for (size_t i = 0; i < k; ++i) {
    absl::Span<const float> row = logits.subspan(i * vocab, vocab);
    auto p = sampling::ComputeSamplingDistribution(row, params, *counts);
    if (!p.ok()) return p.status();
    const uint64_t pos = static_cast<uint64_t>(position + static_cast<int64_t>(i));
    const TokenId d = draft[i];
    double p_d = 0;
    for (size_t j = 0; j < p->tokens.size(); ++j) {
      if (p->tokens[j] == d) p_d = p->probs[j];
    }
    std::optional<SparseQ> qi;
    if (!q.empty()) qi.emplace(q[i]);
    const double q_d = qi ? (*qi)(d) : 1.0;
    if (!(q_d > 0)) return absl::InvalidArgumentError("q gives a draft token no probability");
    bool accept;
    if (p_d >= q_d) {
      accept = true;  // min(1, p/q) = 1: no random number needed
    } else {
      const double u =
          sampling::UniformFromSeed(params.seed, pos, sampling::RandomStream::kSpeculativeAccept);
      accept = u < p_d / q_d;
    }
    if (accept) {
      result.tokens.push_back(d);
      ++result.num_accepted;
      counts->AddOutput(d);
      continue;
    }
    // Residual max(0, p - q) over p's support (where p = 0 it is 0).
    std::vector<double> w(p->tokens.size());
    double total = 0;
    for (size_t j = 0; j < p->tokens.size(); ++j) {
      const double qt = qi ? (*qi)(p->tokens[j]) : (p->tokens[j] == d ? 1.0 : 0.0);
      w[j] = std::max(0.0, p->probs[j] - qt);
      total += w[j];
    }
    if (!(total > 0)) {  // p == q up to rounding: the residual is p itself
      w.assign(p->probs.begin(), p->probs.end());
      total = 1;
    }
    const double u =
        sampling::UniformFromSeed(params.seed, pos, sampling::RandomStream::kSpeculativeResample);
    const TokenId t = p->tokens[Draw(w, total, u)];
    result.tokens.push_back(t);
    counts->AddOutput(t);
    return result;
  }
  // Every draft accepted: the bonus token, exactly as plain decoding draws.
  auto bonus = sampling::Sample(logits.subspan(k * vocab, vocab), params, *counts,
                                position + static_cast<int64_t>(k));
  if (!bonus.ok()) return bonus.status();
  result.tokens.push_back(bonus->token);
  counts->AddOutput(bonus->token);
  return result;
}

absl::StatusOr<VerifyResult> VerifyTree(absl::Span<const float> logits, int64_t vocab,
                                        absl::Span<const TokenId> tokens,
                                        absl::Span<const int32_t> parents,
                                        const sampling::SamplingParams& params,
                                        sampling::TokenCounts* counts, int64_t position) {
  const size_t k = tokens.size();
  if (vocab <= 0 || logits.size() != (k + 1) * static_cast<size_t>(vocab)) {
    return absl::InvalidArgumentError(absl::StrCat("verification needs ", k + 1, " logits rows of ",
                                                   vocab, ", got ", logits.size(), " values"));
  }
  if (parents.size() != k) {
    return absl::InvalidArgumentError("a tree needs one parent per draft token");
  }
  for (size_t i = 0; i < k; ++i) {
    if (parents[i] < -1 || parents[i] >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("draft node ", i, " has parent ", parents[i],
                                                     "; a parent must be -1 or an earlier node"));
    }
  }
  VerifyResult result;
  int32_t at = -1;  // the node whose row decides next (-1: the context)
  for (int64_t depth = 0;; ++depth) {
    absl::Span<const float> row = logits.subspan((at + 1) * vocab, vocab);
    auto drawn = sampling::Sample(row, params, *counts, position + depth);
    if (!drawn.ok()) return drawn.status();
    const TokenId t = drawn->token;
    result.tokens.push_back(t);
    counts->AddOutput(t);
    int32_t next = -1;
    for (size_t i = at + 1; i < k && next < 0; ++i) {
      if (parents[i] == at && tokens[i] == t) next = static_cast<int32_t>(i);
    }
    if (next < 0) return result;  // no child drew it (or a leaf: the bonus token)
    result.path.push_back(next);
    ++result.num_accepted;
    at = next;
  }
}

absl::StatusOr<VerifyResult> VerifyDraft(absl::Span<const float> logits, int64_t vocab,
                                         const Draft& draft, int k,
                                         const sampling::SamplingParams& params,
                                         sampling::TokenCounts* counts, int64_t position) {
  if (k < 0 || k > static_cast<int>(draft.tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot verify ", k, " nodes of a draft of ", draft.tokens.size()));
  }
  const absl::Span<const TokenId> tokens = absl::MakeConstSpan(draft.tokens).first(k);
  if (!IsChain(draft)) {
    return VerifyTree(logits, vocab, tokens, absl::MakeConstSpan(draft.parents).first(k), params,
                      counts, position);
  }
  absl::Span<const DraftDistribution> q;
  if (!draft.q.empty()) q = absl::MakeConstSpan(draft.q).first(k);
  return VerifyChain(logits, vocab, tokens, q, params, counts, position);
}

VerifyResult VerifyChainArgmax(absl::Span<const TokenId> draft, absl::Span<const int32_t> argmax,
                               sampling::TokenCounts* counts) {
  VerifyResult result;
  const size_t k = draft.size();
  for (size_t i = 0; i <= k; ++i) {
    result.tokens.push_back(argmax[i]);
    counts->AddOutput(argmax[i]);
    if (i == k || draft[i] != argmax[i]) break;
    ++result.num_accepted;
  }
  return result;
}

int64_t LogitsRowOf(const VerifyResult& result, size_t m) {
  if (result.path.empty()) return static_cast<int64_t>(m);
  return m == 0 ? 0 : 1 + result.path[m - 1];
}

void RawLogprobs(absl::Span<const float> row, TokenId token, int top_n, float* logprob,
                 std::vector<sampling::TokenLogprob>* top) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float v : row) max_logit = std::max(max_logit, v);
  double sum = 0;
  for (float v : row) sum += std::exp(v - max_logit);
  const double log_z = max_logit + std::log(sum);
  *logprob = static_cast<float>(row[token] - log_z);
  top->clear();
  if (top_n <= 0) return;
  std::vector<int32_t> ids(row.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const size_t n = std::min<size_t>(top_n, ids.size());
  auto better = [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
  for (size_t i = 0; i < n; ++i) top->push_back({ids[i], static_cast<float>(row[ids[i]] - log_z)});
}

}  // namespace tessera::spec
