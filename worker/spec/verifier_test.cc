// The verifier: the greedy rule, draft validation, and losslessness of the
// rejection rule at temperature > 0 (chi-square against the exact target
// distribution), including that the test rejects biased rules.
#include "worker/spec/verifier.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/spec/chi_square.h"

namespace tessera::spec {
namespace {

using ::testing::ElementsAre;

// Significance level of every distribution test here (fixed seeds, so the
// outcome is deterministic; a correct rule fails with probability 1e-3).
constexpr double kAlpha = 1e-3;

std::vector<float> Rows(std::vector<std::vector<float>> rows) {
  std::vector<float> out;
  for (auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

sampling::SamplingParams Greedy() {
  sampling::SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(VerifierTest, GreedyAcceptsWhileDraftIsArgmaxThenTakesTheTargetsToken) {
  // Argmaxes per row: 2, 0, 3, 1.
  std::vector<float> logits = Rows({{0, 1, 5, 2}, {9, 1, 0, 2}, {0, 1, 2, 3}, {0, 4, 1, 1}});
  sampling::TokenCounts counts;
  auto r = VerifyChain(logits, 4, {2, 0, 1}, {}, Greedy(), &counts, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_accepted, 2);
  EXPECT_THAT(r->tokens, ElementsAre(2, 0, 3));
  r = VerifyChain(logits, 4, {2, 0, 3}, {}, Greedy(), &counts, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_accepted, 3);
  EXPECT_THAT(r->tokens, ElementsAre(2, 0, 3, 1));  // bonus
  r = VerifyChain(logits, 4, {1, 0, 3}, {}, Greedy(), &counts, 10);
  EXPECT_THAT(r->tokens, ElementsAre(2));
  // Penalties see the tokens emitted before each row: a repetition penalty
  // strong enough moves row 2's argmax away from 0 once 0 was emitted...
  sampling::SamplingParams pen = Greedy();
  pen.presence_penalty = 2;
  sampling::TokenCounts fresh;
  std::vector<float> same = Rows({{3, 2, 0, 0}, {3, 2, 0, 0}});
  r = VerifyChain(same, 4, {0}, {}, pen, &fresh, 0);
  EXPECT_THAT(r->tokens, ElementsAre(0, 1));
}

TEST(VerifierTest, MalformedInputIsRefused) {
  sampling::TokenCounts counts;
  std::vector<float> two = Rows({{0, 1}, {1, 0}});
  EXPECT_FALSE(VerifyChain(two, 2, {0, 1}, {}, Greedy(), &counts, 0).ok());  // 2 rows for 2 drafts
  std::vector<float> nan = Rows({{0, NAN}, {1, 0}});
  EXPECT_FALSE(VerifyChain(nan, 2, {0}, {}, Greedy(), &counts, 0).ok());
  Draft d;
  d.tokens = {1, 5};
  EXPECT_FALSE(ValidateDraft(d, 4).ok());
  d.tokens = {1, 2};
  EXPECT_TRUE(ValidateDraft(d, 4).ok());
  d.parents = {-1, -1};
  EXPECT_FALSE(ValidateDraft(d, 4).ok());  // a tree
  d.parents = {-1, 0};
  EXPECT_TRUE(ValidateDraft(d, 4).ok());
  d.q = {{{1}, {1.0f}}};
  EXPECT_FALSE(ValidateDraft(d, 4).ok());  // one q for two tokens
  d.q = {{{1}, {1.0f}}, {{3}, {1.0f}}};
  EXPECT_FALSE(ValidateDraft(d, 4).ok());  // q[1] gives token 2 nothing
  d.q = {{{1}, {1.0f}}, {{2, 3}, {0.5f, 0.5f}}};
  EXPECT_TRUE(ValidateDraft(d, 4).ok());
}

// One verification of a draft of length 2 drawn from q, rows fixed. Returns
// the first emitted token.
// kOneHot drops q (treats the sampled draft as one-hot): still lossless,
// since the one-hot rule is exact for any fixed draft token. kWrongQ sends a
// q that is not the distribution the draft was drawn from (uniform), and
// kAcceptAlways skips the test: both biased.
enum class Rule { kExact, kOneHot, kWrongQ, kAcceptAlways };

struct Case {
  std::vector<float> logits;           // 3 rows
  std::vector<std::vector<double>> q;  // the draft's two distributions
  sampling::SamplingParams params;
  int vocab;
};

std::vector<int64_t> FirstTokenHistogram(const Case& s, Rule rule, int n) {
  std::mt19937_64 draft_rng(12345);
  std::vector<int64_t> hist(s.vocab);
  for (int t = 0; t < n; ++t) {
    std::vector<TokenId> draft;
    std::vector<DraftDistribution> q;
    for (int i = 0; i < 2; ++i) {
      std::discrete_distribution<int> pick(s.q[i].begin(), s.q[i].end());
      draft.push_back(pick(draft_rng));
      DraftDistribution d;
      for (int v = 0; v < s.vocab; ++v) {
        d.tokens.push_back(v);
        d.probs.push_back(rule == Rule::kWrongQ ? 1.0f / s.vocab : static_cast<float>(s.q[i][v]));
      }
      q.push_back(d);
    }
    if (rule == Rule::kAcceptAlways) {
      ++hist[draft[0]];
      continue;
    }
    sampling::SamplingParams p = s.params;
    p.seed = 1000 + t;
    sampling::TokenCounts counts;
    auto r = VerifyChain(s.logits, s.vocab, draft,
                         rule == Rule::kOneHot ? absl::Span<const DraftDistribution>() : q, p,
                         &counts, 7);
    EXPECT_TRUE(r.ok());
    ++hist[r->tokens[0]];
  }
  return hist;
}

std::vector<double> TargetFirstToken(const Case& s) {
  sampling::TokenCounts counts;
  auto p = sampling::ComputeSamplingDistribution(absl::MakeConstSpan(s.logits).first(s.vocab),
                                                 s.params, counts);
  std::vector<double> out(s.vocab);
  for (size_t i = 0; i < p->tokens.size(); ++i) out[p->tokens[i]] = p->probs[i];
  return out;
}

Case MakeSetup(float temperature, int top_k, float top_p) {
  Case s;
  s.vocab = 8;
  s.logits = Rows({{1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 0.7f, -1.0f, 1.5f},
                   {0.1f, 0.3f, 0.2f, 0.0f, 1.1f, 0.4f, 0.9f, -0.2f},
                   {0, 0, 0, 0, 0, 0, 0, 1}});
  s.q = {{0.05, 0.2, 0.2, 0.1, 0.15, 0.1, 0.1, 0.1},
         {0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125}};
  s.params.temperature = temperature;
  s.params.top_k = top_k;
  s.params.top_p = top_p;
  return s;
}

TEST(VerifierTest, RejectionSamplingIsLossless) {
  constexpr int kSamples = 40000;
  for (const Case& s : {MakeSetup(1.0f, 0, 1.0f), MakeSetup(0.7f, 5, 0.9f)}) {
    const std::vector<double> target = TargetFirstToken(s);
    ChiSquareResult exact =
        ChiSquareGoodnessOfFit(FirstTokenHistogram(s, Rule::kExact, kSamples), target);
    EXPECT_GT(exact.p_value, kAlpha)
        << "chi2=" << exact.statistic << " df=" << exact.degrees_of_freedom;
    ChiSquareResult one_hot =
        ChiSquareGoodnessOfFit(FirstTokenHistogram(s, Rule::kOneHot, kSamples), target);
    EXPECT_GT(one_hot.p_value, kAlpha) << "chi2=" << one_hot.statistic;
    // The same test rejects biased rules: a q that is not the draft's, and
    // accepting every draft.
    ChiSquareResult wrong_q =
        ChiSquareGoodnessOfFit(FirstTokenHistogram(s, Rule::kWrongQ, kSamples), target);
    EXPECT_LT(wrong_q.p_value, kAlpha) << "chi2=" << wrong_q.statistic;
    ChiSquareResult always =
        ChiSquareGoodnessOfFit(FirstTokenHistogram(s, Rule::kAcceptAlways, kSamples), target);
    EXPECT_LT(always.p_value, kAlpha) << "chi2=" << always.statistic;
  }
}

TEST(VerifierTest, ChiSquareHelperMatchesKnownQuantiles) {
  // chi2(df=10) upper 0.001 quantile is 29.59; check the approximation.
  const double k = 10, x = 29.59;
  const double z = (std::cbrt(x / k) - (1 - 2 / (9 * k))) / std::sqrt(2 / (9 * k));
  EXPECT_NEAR(0.5 * std::erfc(z / std::sqrt(2.0)), 0.001, 0.0003);
}

}  // namespace
}  // namespace tessera::spec
