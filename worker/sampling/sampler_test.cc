#include "worker/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::sampling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> RandomLogits(int vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// Reference softmax in double.
std::vector<double> Softmax(const std::vector<double>& logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(logits[i] - m);
  for (double& x : p) x /= z;
  return p;
}

std::set<int32_t> Support(const SamplingDistribution& d) {
  return std::set<int32_t>(d.tokens.begin(), d.tokens.end());
}

SamplingDistribution Dist(const std::vector<float>& logits, const SamplingParams& p,
                          const TokenCounts& counts = {}) {
  absl::StatusOr<SamplingDistribution> d = ComputeSamplingDistribution(logits, p, counts);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : SamplingDistribution{};
}

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = RandomLogits(1000, seed);
    SamplingParams p{.temperature = 0.0f, .seed = seed};
    absl::StatusOr<SampleResult> r = Sample(logits, p, {}, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(r->token, expected);
    EXPECT_EQ(r->rank, 1);
    EXPECT_EQ(r->processed_logprob, 0.0f);
  }
  std::vector<float> tied = {1.0f, 5.0f, 2.0f, 5.0f};
  absl::StatusOr<SampleResult> r = Sample(tied, {.temperature = 0.0f}, {}, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token, 1);
  // Temperatures below kGreedyTemperature are greedy too.
  r = Sample(tied, {.temperature = kGreedyTemperature / 2}, {}, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token, 1);
}

TEST(SamplerTest, SeededDrawsDoNotDependOnCallOrderOrOtherSequences) {
  const int kSeqs = 6, kSteps = 40;
  std::vector<std::vector<float>> logits;
  for (int s = 0; s < kSeqs; ++s) logits.push_back(RandomLogits(500, 100 + s, 1.0f));
  auto params = [](int s) {
    return SamplingParams{.temperature = 0.9f, .top_p = 0.95f, .seed = 1000u + s};
  };
  // Sequence-major order.
  std::vector<std::vector<int32_t>> a(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    for (int step = 0; step < kSteps; ++step) {
      a[s].push_back(Sample(logits[s], params(s), {}, 10 + step)->token);
    }
  }
  // Step-major, sequences in a shuffled order each step, plus unrelated
  // sequences sampled in between (a different "batch").
  std::vector<std::vector<int32_t>> b(kSeqs, std::vector<int32_t>(kSteps));
  std::mt19937 rng(5);
  std::vector<int> order(kSeqs);
  std::iota(order.begin(), order.end(), 0);
  for (int step = kSteps - 1; step >= 0; --step) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int s : order) {
      ASSERT_TRUE(Sample(RandomLogits(500, rng()), {.seed = rng()}, {}, step).ok());
      b[s][step] = Sample(logits[s], params(s), {}, 10 + step)->token;
    }
  }
  EXPECT_EQ(a, b);
  // And draws do vary with the position (not one token repeated).
  for (int s = 0; s < kSeqs; ++s) {
    EXPECT_GT(std::set<int32_t>(a[s].begin(), a[s].end()).size(), 1u) << "sequence " << s;
  }
}

TEST(SamplerTest, TopKKeepsTheKLargestAndTiesAtTheBoundary) {
  std::vector<float> logits = RandomLogits(200, 3);
  std::vector<int32_t> by_value(200);
  std::iota(by_value.begin(), by_value.end(), 0);
  std::sort(by_value.begin(), by_value.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int k : {1, 2, 7, 50, 199}) {
    SamplingDistribution d = Dist(logits, {.temperature = 1.3f, .top_k = k});
    EXPECT_EQ(Support(d), std::set<int32_t>(by_value.begin(), by_value.begin() + k)) << k;
  }
  for (int k : {0, -1, 200, 100000}) {
    EXPECT_EQ(Dist(logits, {.top_k = k}).tokens.size(), 200u) << "top_k " << k << " disables";
  }
  std::vector<float> ties = {3.0f, 1.0f, 2.0f, 2.0f, 0.5f, 2.0f};
  EXPECT_EQ(Support(Dist(ties, {.top_k = 2})), (std::set<int32_t>{0, 2, 3, 5}));
}

// Probabilities 1/2, 1/4, 1/8, ... make the top-p boundary easy to derive.
std::vector<float> HalvingLogits(int n) {
  std::vector<float> logits(n);
  for (int i = 0; i < n; ++i) logits[i] = -static_cast<float>(i) * std::log(2.0f);
  return logits;
}

TEST(SamplerTest, TopPKeepsTokensWhileTheMassBeforeThemIsBelowP) {
  std::vector<float> logits = HalvingLogits(12);
  // Mass before token i is 1 - 2^-i (ignoring the tiny tail renormalisation).
  EXPECT_EQ(Support(Dist(logits, {.top_p = 0.5f})), (std::set<int32_t>{0}));
  EXPECT_EQ(Support(Dist(logits, {.top_p = 0.6f})), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Support(Dist(logits, {.top_p = 0.8f})), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Dist(logits, {.top_p = 0.9f})), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(Dist(logits, {.top_p = 1.0f}).tokens.size(), 12u);
  // A very small p still keeps the most likely token.
  EXPECT_EQ(Support(Dist(logits, {.top_p = 1e-6f})), (std::set<int32_t>{0}));
}

// top-p on a large random vocabulary against a direct computation: sort all
// probabilities, keep while the preceding mass is < p.
TEST(SamplerTest, TopPMatchesAFullSortOnALargeVocabulary) {
  for (uint32_t seed = 0; seed < 5; ++seed) {
    std::vector<float> logits = RandomLogits(50000, seed, 4.0f);
    for (float top_p : {0.3f, 0.9f, 0.99f}) {
      std::vector<double> scaled(logits.begin(), logits.end());
      for (double& l : scaled) l /= 0.8;
      std::vector<double> p = Softmax(scaled);
      std::vector<int32_t> order(p.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      std::set<int32_t> expected;
      double before = 0;
      for (int32_t t : order) {
        if (before >= top_p) break;
        expected.insert(t);
        before += p[t];
      }
      SamplingDistribution d = Dist(logits, {.temperature = 0.8f, .top_p = top_p});
      EXPECT_EQ(Support(d), expected) << "seed " << seed << " top_p " << top_p;
    }
  }
}

TEST(SamplerTest, MinPKeepsTokensWithinAFactorOfTheBest) {
  std::vector<float> logits = HalvingLogits(10);  // p_i / p_0 = 2^-i
  EXPECT_EQ(Support(Dist(logits, {.min_p = 0.3f})), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(Support(Dist(logits, {.min_p = 0.24f})), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(Support(Dist(logits, {.min_p = 1.0f})), (std::set<int32_t>{0}));
  // Temperature applies first: at T = 0.5 the ratios square (2^-2i).
  EXPECT_EQ(Support(Dist(logits, {.temperature = 0.5f, .min_p = 0.2f})), (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, TopKThenTopPThenMinPInThatOrder) {
  // p = 0.4, 0.3, 0.2, 0.1. top-k 2 renormalises to 4/7, 3/7; top-p 0.5 then
  // keeps only token 0 (the mass before token 1 is 4/7 >= 0.5). Applying
  // top-p first would keep tokens 0 and 1 (mass before token 1 is 0.4).
  std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  EXPECT_EQ(Support(Dist(logits, {.top_k = 2, .top_p = 0.5f})), (std::set<int32_t>{0}));
  EXPECT_EQ(Support(Dist(logits, {.top_k = 3, .top_p = 0.6f})), (std::set<int32_t>{0, 1}));
  // min-p after top-p: top-p 0.95 keeps 0..3, min-p 0.45 keeps p >= 0.18.
  EXPECT_EQ(Support(Dist(logits, {.top_p = 0.95f, .min_p = 0.45f})), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, MaskedTokensAreNeverDrawn) {
  std::vector<float> logits(50, 0.0f);
  for (int i = 0; i < 50; i += 2) logits[i] = kNegInf;
  SamplingDistribution d = Dist(logits, {});
  EXPECT_EQ(d.tokens.size(), 25u);
  for (int64_t pos = 0; pos < 500; ++pos) {
    absl::StatusOr<SampleResult> r = Sample(logits, {.seed = 9}, {}, pos);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->token % 2, 1);
  }
}

// Chi-square goodness of fit of 60000 seeded draws against the processed
// distribution (temperature 0.7, top-k 5 over 8 tokens, so 5 categories and
// 4 degrees of freedom). The threshold 18.47 is the chi-square(4) quantile
// at p = 0.999; the seed is fixed, so the test is deterministic.
TEST(SamplerTest, FrequenciesMatchTheProcessedDistribution) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.9f, -3.0f, 1.5f, -1.0f};
  const SamplingParams p{.temperature = 0.7f, .top_k = 5, .seed = 20240601};
  // Expected distribution computed here from the definition: the 5 largest
  // logits, divided by T, softmaxed.
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> kept;
  for (int i = 0; i < 5; ++i) kept.push_back(logits[order[i]] / static_cast<double>(p.temperature));
  std::vector<double> probs = Softmax(kept);
  std::map<int32_t, double> expected;
  for (int i = 0; i < 5; ++i) expected[order[i]] = probs[i];

  SamplingDistribution d = Dist(logits, p);
  ASSERT_EQ(d.tokens.size(), 5u);
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    // The sampler evaluates exp() in float: relative error well below 1e-6.
    EXPECT_NEAR(d.probs[i], expected.at(d.tokens[i]), 1e-6 * expected.at(d.tokens[i]));
  }

  const int kDraws = 60000;
  std::map<int32_t, int> observed;
  for (int64_t pos = 0; pos < kDraws; ++pos) {
    absl::StatusOr<SampleResult> r = Sample(logits, p, {}, pos);
    ASSERT_TRUE(r.ok());
    ++observed[r->token];
    EXPECT_NEAR(r->processed_logprob, std::log(expected.at(r->token)), 1e-5);
  }
  double chi2 = 0;
  for (const auto& [token, prob] : expected) {
    const double e = prob * kDraws;
    const double o = observed.count(token) ? observed[token] : 0;
    chi2 += (o - e) * (o - e) / e;
  }
  EXPECT_EQ(observed.size(), 5u) << "a token outside the top-k was drawn";
  EXPECT_LT(chi2, 18.47);
}

TEST(SamplerTest, PenaltiesFollowTheVllmFormulas) {
  // token: 0 prompt-only, 1 prompt+output x2, 2 output x3, 3 unseen, 4 output x1 (negative logit)
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.25f, -1.0f};
  TokenCounts counts;
  counts.AddPrompt(std::vector<int32_t>{0, 1, 0});
  counts.AddOutput(1);
  counts.AddOutput(1);
  for (int i = 0; i < 3; ++i) counts.AddOutput(2);
  counts.AddOutput(4);
  const SamplingParams p{
      .repetition_penalty = 2.0f, .presence_penalty = 0.25f, .frequency_penalty = 0.5f};
  // Penalised logits by hand:
  //   0: 2 / 2                      = 1
  //   1: 1 / 2 - 0.5 * 2 - 0.25     = -0.75
  //   2: 0.5 / 2 - 0.5 * 3 - 0.25   = -1.5
  //   3: 0.25 (untouched)
  //   4: -1 * 2 - 0.5 * 1 - 0.25    = -2.75
  const std::vector<double> penalised = {1.0, -0.75, -1.5, 0.25, -2.75};
  std::vector<double> expected = Softmax(penalised);
  SamplingDistribution d = Dist(logits, p, counts);
  ASSERT_THAT(d.tokens, ElementsAre(0, 1, 2, 3, 4));
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(d.probs[i], expected[i], 1e-6 * expected[i]) << i;

  // Greedy sees the penalties too: token 0 stays best here, but a strong
  // frequency penalty moves the argmax to the unseen token 3.
  SamplingParams greedy = p;
  greedy.temperature = 0;
  EXPECT_EQ(Sample(logits, greedy, counts, 0)->token, 0);
  counts.AddOutput(0);
  greedy.frequency_penalty = 2.0f;
  EXPECT_EQ(Sample(logits, greedy, counts, 0)->token, 3);
}

TEST(SamplerTest, LogprobsAreOfTheRawDistribution) {
  std::vector<float> logits = RandomLogits(300, 11);
  std::vector<double> raw(logits.begin(), logits.end());
  std::vector<double> p = Softmax(raw);
  TokenCounts counts;
  counts.AddOutput(5);
  const SamplingParams params{
      .temperature = 0.5f, .top_k = 20, .frequency_penalty = 1.5f, .seed = 77, .top_logprobs = 5};
  absl::StatusOr<SampleResult> r = Sample(logits, params, counts, 12);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->logprob, std::log(p[r->token]), 1e-5);
  int above = 0;
  for (size_t i = 0; i < p.size(); ++i) above += logits[i] > logits[r->token];
  EXPECT_EQ(r->rank, above + 1);

  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  ASSERT_EQ(r->top_logprobs.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r->top_logprobs[i].token, order[i]);
    EXPECT_NEAR(r->top_logprobs[i].logprob, std::log(p[order[i]]), 1e-5);
  }
  SamplingParams none = params;
  none.top_logprobs = 0;
  EXPECT_TRUE(Sample(logits, none, counts, 12)->top_logprobs.empty());
}

struct BadParams {
  const char* name;
  SamplingParams params;
  const char* message;
};

class InvalidParamsTest : public ::testing::TestWithParam<BadParams> {};

TEST_P(InvalidParamsTest, IsInvalidArgumentNamingTheField) {
  const BadParams& bad = GetParam();
  absl::Status s = ValidateSamplingParams(bad.params, 1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.name;
  EXPECT_THAT(std::string(s.message()), HasSubstr(bad.message));
  // The sampler refuses them the same way.
  std::vector<float> logits(1000, 0.0f);
  absl::StatusOr<SampleResult> r = Sample(logits, bad.params, {}, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(bad.message));
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

INSTANTIATE_TEST_SUITE_P(
    All, InvalidParamsTest,
    ::testing::Values(
        BadParams{"NegativeTemperature",
                  {.temperature = -0.5f},
                  "temperature must be a finite number >= 0, got -0.5"},
        BadParams{"NaNTemperature", {.temperature = kNaN}, "temperature must be a finite number"},
        BadParams{"InfTemperature", {.temperature = kInf}, "temperature must be a finite number"},
        BadParams{"TopPZero", {.top_p = 0.0f}, "top_p must be in (0, 1], got 0"},
        BadParams{"TopPAboveOne", {.top_p = 1.5f}, "top_p must be in (0, 1], got 1.5"},
        BadParams{"TopPNaN", {.top_p = kNaN}, "top_p must be in (0, 1]"},
        BadParams{"TopKNegative",
                  {.top_k = -2},
                  "top_k must be -1 or 0 (disabled) or a "
                  "positive integer, got -2"},
        BadParams{"MinPNegative", {.min_p = -0.1f}, "min_p must be in [0, 1]"},
        BadParams{"MinPAboveOne", {.min_p = 1.01f}, "min_p must be in [0, 1]"},
        BadParams{"RepetitionZero",
                  {.repetition_penalty = 0.0f},
                  "repetition_penalty must be a finite number > 0, got 0"},
        BadParams{"PresenceTooLarge",
                  {.presence_penalty = 2.5f},
                  "presence_penalty must be in [-2, 2], got 2.5"},
        BadParams{"FrequencyTooSmall",
                  {.frequency_penalty = -3.0f},
                  "frequency_penalty must be in [-2, 2], got -3"},
        BadParams{"FrequencyNaN", {.frequency_penalty = kNaN}, "frequency_penalty must be in"},
        BadParams{
            "TooManyLogprobs", {.top_logprobs = 21}, "top_logprobs must be in [0, 20], got 21"},
        BadParams{"NegativeLogprobs", {.top_logprobs = -1}, "top_logprobs must be in [0, 20]"}),
    [](const ::testing::TestParamInfo<BadParams>& info) { return info.param.name; });

TEST(SamplerTest, ValidParamsAndVocabularyLimits) {
  EXPECT_TRUE(ValidateSamplingParams({}, 10).ok());
  EXPECT_TRUE(ValidateSamplingParams({.temperature = 0,
                                      .top_k = -1,
                                      .top_p = 1,
                                      .min_p = 1,
                                      .presence_penalty = -2,
                                      .frequency_penalty = 2,
                                      .top_logprobs = 20},
                                     100)
                  .ok());
  EXPECT_THAT(std::string(ValidateSamplingParams({.top_logprobs = 5}, 3).message()),
              HasSubstr("top_logprobs must be at most the vocabulary size 3, got 5"));
  EXPECT_THAT(std::string(ValidateSamplingParams({}, 0).message()),
              HasSubstr("vocab_size must be positive"));
}

TEST(SamplerTest, BadLogitsAndHistoryAreRefused) {
  auto message = [](std::vector<float> logits, const TokenCounts& counts = {}) {
    absl::StatusOr<SampleResult> r = Sample(logits, {}, counts, 0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_THAT(message({0.0f, kNaN}), HasSubstr("logits[1] is NaN"));
  EXPECT_THAT(message({kInf, 0.0f}), HasSubstr("logits[0] is +inf"));
  EXPECT_THAT(message({kNegInf, kNegInf}), HasSubstr("every logit is -inf"));
  EXPECT_THAT(message({}), HasSubstr("logits row has 0 entries"));
  TokenCounts counts;
  counts.AddOutput(7);
  EXPECT_THAT(message({0.0f, 1.0f}, counts),
              HasSubstr("token 7 in the sequence history is outside the vocabulary [0, 2)"));
  EXPECT_THAT(std::string(Sample(std::vector<float>{1.0f}, {}, {}, -1).status().message()),
              HasSubstr("position must be >= 0"));
}

TEST(SamplerTest, ExtremePenaltiesDoNotOverflow) {
  const std::vector<float> logits = {30.0f, 29.0f, -20.0f};
  TokenCounts counts;
  counts.AddPrompt(std::vector<int32_t>{0, 1, 2});
  absl::StatusOr<SampleResult> r =
      Sample(logits, {.temperature = 2e-5f, .repetition_penalty = 1e-30f}, counts, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token, 0);
  EXPECT_TRUE(std::isfinite(r->processed_logprob));
}

}  // namespace
}  // namespace tessera::sampling
