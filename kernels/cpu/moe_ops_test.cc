// The mixture-of-experts kernels: routing (both scorings, worked examples,
// the tie rule, validation) and the expert MLPs (optimized vs reference,
// unchosen experts never read, expert-parallel partial sums, order
// independence).
//
// Tolerances: routing weights are fp32 softmax/sigmoid values compared with
// double-precision expectations to 1e-6; expert outputs (sums of a few
// products of O(1) values over hidden <= 64) differ between the fp32
// optimized GEMM and the double-accumulating reference by < 1e-5.
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"

namespace tessera::kernels::cpu {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed Route(const std::vector<float>& logits, const MoeRoutingParams& p) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / p.num_experts;
  Routed r{std::vector<int32_t>(tokens * p.top_k), std::vector<float>(tokens * p.top_k)};
  reference::MoeRoute(logits.data(), tokens, p, r.ids.data(), r.weights.data());
  return r;
}

TEST(MoeRoutingTest, SoftmaxTopKRenormalised) {
  MoeRoutingParams p{MoeScoringFunction::kSoftmax, 4, 2, /*renormalize=*/true};
  Routed r = Route({0, 1, 2, 3}, p);
  EXPECT_THAT(r.ids, ElementsAre(3, 2));
  const double e3 = std::exp(3.0), e2 = std::exp(2.0);
  EXPECT_NEAR(r.weights[0], e3 / (e3 + e2), 1e-6);
  EXPECT_NEAR(r.weights[1], e2 / (e3 + e2), 1e-6);

  p.renormalize = false;  // the softmax probabilities themselves
  r = Route({0, 1, 2, 3}, p);
  const double total = 1 + std::exp(1.0) + e2 + e3;
  EXPECT_NEAR(r.weights[0], e3 / total, 1e-6);
  EXPECT_NEAR(r.weights[1], e2 / total, 1e-6);
}

TEST(MoeRoutingTest, TiesGoToTheLowerExpert) {
  MoeRoutingParams p{MoeScoringFunction::kSoftmax, 5, 1, true};
  EXPECT_THAT(Route({1, 5, 0, 5, 5}, p).ids, ElementsAre(1));
  p.top_k = 3;
  EXPECT_THAT(Route({1, 5, 0, 5, 5}, p).ids, ElementsAre(1, 3, 4));
  p.top_k = 5;
  EXPECT_THAT(Route({2, 2, 2, 2, 2}, p).ids, ElementsAre(0, 1, 2, 3, 4));
}

// 8 experts in 4 groups of 2, 2 groups kept, top-2. Scores s = sigmoid(x);
// choice c = s + bias:
//   expert   0     1     2     3     4     5     6     7
//   x        0     0     0     0     0     1     0     0
//   bias   .25   -.3    .1    .1     0    .3     0     0
//   c      .75    .2    .6    .6    .5  1.031   .5    .5
// Group scores (top-2 sums): g0 .95, g1 1.2, g2 1.531, g3 1.0 -> keep g2, g1.
// Expert 0 (c = .75) has the third-best choice score but its group lost; of
// the kept experts 5 wins, then 2 and 3 tie at .6 and the lower, 2, wins.
// Weights come from s, not c: s5 = sigmoid(1), s2 = .5.
TEST(MoeRoutingTest, SigmoidGroupedChoosesWithBiasInKeptGroupsAndWeighsWithout) {
  const std::vector<float> bias = {0.25f, -0.3f, 0.1f, 0.1f, 0, 0.3f, 0, 0};
  MoeRoutingParams p{MoeScoringFunction::kSigmoidGrouped,
                     8,
                     2,
                     /*renormalize=*/true,
                     4,
                     2,
                     /*scaling_factor=*/2.5f,
                     bias.data()};
  const std::vector<float> logits = {0, 0, 0, 0, 0, 1, 0, 0};
  Routed r = Route(logits, p);
  EXPECT_THAT(r.ids, ElementsAre(5, 2));
  const double s5 = Sigmoid(1), s2 = 0.5;
  EXPECT_NEAR(r.weights[0], 2.5 * s5 / (s5 + s2), 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s2 / (s5 + s2), 1e-6);

  p.renormalize = false;
  r = Route(logits, p);
  EXPECT_NEAR(r.weights[0], 2.5 * s5, 1e-6);
  EXPECT_NEAR(r.weights[1], 2.5 * s2, 1e-6);

  // One group kept: only experts 4 and 5 are eligible.
  p.topk_groups = 1;
  EXPECT_THAT(Route(logits, p).ids, ElementsAre(5, 4));
  // Without a bias the choice follows s alone: 5, then the tie among the
  // rest of the kept groups goes to the lowest index.
  p.correction_bias = nullptr;
  p.topk_groups = 4;
  EXPECT_THAT(Route(logits, p).ids, ElementsAre(5, 0));
}

TEST(MoeRoutingTest, OptimizedEqualsReferenceBitwise) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-6, 6);
  const int tokens = 301, experts = 64;
  std::vector<float> logits(tokens * experts), bias(experts);
  for (float& v : logits) v = dist(rng);
  for (float& v : bias) v = dist(rng) / 60;
  ThreadPool pool(3);
  const CpuContext ctx{&pool, CpuIsa::kScalar};
  for (const MoeRoutingParams& p :
       {MoeRoutingParams{MoeScoringFunction::kSoftmax, experts, 8, true},
        MoeRoutingParams{MoeScoringFunction::kSigmoidGrouped, experts, 8, true, 8, 4, 2.5f,
                         bias.data()}}) {
    ASSERT_TRUE(ValidateMoeRouting(p).ok());
    Routed want = Route(logits, p);
    std::vector<int32_t> ids(want.ids.size());
    std::vector<float> weights(want.weights.size());
    MoeRoute(ctx, logits.data(), tokens, p, ids.data(), weights.data());
    EXPECT_EQ(ids, want.ids);
    EXPECT_EQ(weights, want.weights);
  }
}

TEST(MoeRoutingTest, InvalidParametersAreErrors) {
  auto message = [](MoeRoutingParams p) { return std::string(ValidateMoeRouting(p).message()); };
  EXPECT_THAT(message({MoeScoringFunction::kSoftmax, 4, 5}),
              HasSubstr("top_k = 5 must be in [1, 4]"));
  EXPECT_THAT(message({MoeScoringFunction::kSoftmax, 4, 0}), HasSubstr("top_k = 0"));
  EXPECT_THAT(message({MoeScoringFunction::kSigmoidGrouped, 8, 2, true, 3, 1}),
              HasSubstr("num_groups = 3 must split 8 experts"));
  EXPECT_THAT(message({MoeScoringFunction::kSigmoidGrouped, 8, 2, true, 8, 1}),
              HasSubstr("groups of >= 2"));
  EXPECT_THAT(message({MoeScoringFunction::kSigmoidGrouped, 8, 2, true, 4, 5}),
              HasSubstr("topk_groups = 5 must be in [1, 4]"));
  EXPECT_THAT(message({MoeScoringFunction::kSigmoidGrouped, 8, 5, true, 4, 2}),
              HasSubstr("top_k = 5 exceeds the experts of 2 groups"));
}

// Random experts (fp32 weights) and a routing, for the expert tests.
class MoeExpertsTest : public ::testing::Test {
 protected:
  static constexpr int64_t kHidden = 24, kInter = 7, kExperts = 6, kTokens = 9;
  static constexpr int kTopK = 2;

  void SetUp() override {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1, 1);
    auto random = [&](int64_t n) {
      std::vector<float> v(n);
      for (float& x : v) x = dist(rng);
      return v;
    };
    for (int e = 0; e < kExperts; ++e) {
      storage_.push_back(random(2 * kInter * kHidden));
      gate_up_.push_back({storage_.back().data(), DType::kF32, 2 * kInter, kHidden});
      storage_.push_back(random(kHidden * kInter));
      down_.push_back({storage_.back().data(), DType::kF32, kHidden, kInter});
    }
    x_ = random(kTokens * kHidden);
    // Experts 1 and 4 are chosen by nobody.
    ids_ = {0, 2, 3, 5, 2, 0, 5, 3, 0, 3, 2, 5, 3, 0, 5, 2, 0, 3};
    weights_ = random(kTokens * kTopK);
  }

  MoeExpertsArgs Args(float* out) const {
    MoeExpertsArgs a;
    a.x = x_.data();
    a.num_tokens = kTokens;
    a.hidden = kHidden;
    a.gate_up = gate_up_;
    a.down = down_;
    a.ids = ids_.data();
    a.weights = weights_.data();
    a.top_k = kTopK;
    a.out = out;
    return a;
  }

  std::vector<std::vector<float>> storage_;
  std::vector<WeightMatrix> gate_up_, down_;
  std::vector<float> x_, weights_;
  std::vector<int32_t> ids_;
};

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST_F(MoeExpertsTest, OptimizedMatchesReferenceAndAHandComputedToken) {
  std::vector<float> want(kTokens * kHidden), got(want.size());
  ASSERT_TRUE(ValidateMoeExperts(Args(want.data())).ok());
  reference::MoeExperts(Args(want.data()));
  ThreadPool pool(2);
  MoeExperts(CpuContext{&pool, BestCpuIsa(HostCpuFeatures())}, Args(got.data()));
  EXPECT_LT(MaxAbsDiff(got, want), 1e-5f);

  // Token 0 by hand: w0 * expert0(x0) + w1 * expert2(x0), in double.
  for (int64_t h = 0; h < kHidden; ++h) {
    double sum = 0;
    for (int j = 0; j < kTopK; ++j) {
      const int e = ids_[j];
      const float* gu = storage_[2 * e].data();
      const float* dn = storage_[2 * e + 1].data();
      double y = 0;
      for (int64_t i = 0; i < kInter; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < kHidden; ++c) {
          g += double{gu[i * kHidden + c]} * x_[c];
          u += double{gu[(kInter + i) * kHidden + c]} * x_[c];
        }
        y += double{dn[h * kInter + i]} * (g / (1 + std::exp(-g)) * u);
      }
      sum += weights_[j] * y;
    }
    EXPECT_NEAR(want[h], sum, 1e-5) << h;
  }
}

TEST_F(MoeExpertsTest, ExpertsNobodyChoseAreNeverRead) {
  std::vector<float> want(kTokens * kHidden), got(want.size());
  MoeExperts(CpuContext{}, Args(want.data()));
  gate_up_[1].data = gate_up_[4].data = down_[1].data = down_[4].data = nullptr;
  MoeExperts(CpuContext{}, Args(got.data()));
  EXPECT_EQ(got, want);
  reference::MoeExperts(Args(got.data()));
  EXPECT_LT(MaxAbsDiff(got, want), 1e-5f);
}

// Expert parallelism: two ranks holding experts [0, 3) and [3, 6) produce
// partial outputs whose sum is the whole layer's output.
TEST_F(MoeExpertsTest, ExpertRangesSumToTheWhole) {
  std::vector<float> whole(kTokens * kHidden), low(whole.size()), high(whole.size());
  MoeExperts(CpuContext{}, Args(whole.data()));
  MoeExpertsArgs a = Args(low.data());
  a.gate_up = absl::MakeConstSpan(gate_up_).subspan(0, 3);
  a.down = absl::MakeConstSpan(down_).subspan(0, 3);
  MoeExperts(CpuContext{}, a);
  a.out = high.data();
  a.first_expert = 3;
  a.gate_up = absl::MakeConstSpan(gate_up_).subspan(3);
  a.down = absl::MakeConstSpan(down_).subspan(3);
  MoeExperts(CpuContext{}, a);
  for (size_t i = 0; i < whole.size(); ++i) low[i] += high[i];
  EXPECT_LT(MaxAbsDiff(low, whole), 1e-5f);
}

TEST_F(MoeExpertsTest, OutputDoesNotDependOnTheOrderTheRouterListedExperts) {
  std::vector<float> want(kTokens * kHidden), got(want.size());
  MoeExperts(CpuContext{}, Args(want.data()));
  for (int64_t t = 0; t < kTokens; ++t) {
    std::swap(ids_[t * kTopK], ids_[t * kTopK + 1]);
    std::swap(weights_[t * kTopK], weights_[t * kTopK + 1]);
  }
  MoeExperts(CpuContext{}, Args(got.data()));
  EXPECT_EQ(got, want);
}

TEST_F(MoeExpertsTest, MismatchedShapesAreErrors) {
  std::vector<float> out(kTokens * kHidden);
  down_[3].cols = kInter + 1;
  EXPECT_THAT(std::string(ValidateMoeExperts(Args(out.data())).message()),
              HasSubstr("expert 3 has gate_up [14, 24] and down [24, 8]; expected [14, 24] and "
                        "[24, 7]"));
  MoeExpertsArgs a = Args(out.data());
  a.down = absl::MakeConstSpan(down_).subspan(1);
  EXPECT_THAT(std::string(ValidateMoeExperts(a).message()),
              HasSubstr("6 gate_up and 5 down matrices"));
}

}  // namespace
}  // namespace tessera::kernels::cpu
