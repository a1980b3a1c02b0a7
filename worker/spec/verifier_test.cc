// The verifier: the greedy rule, draft validation, and losslessness of the
// rejection rule at temperature > 0 (chi-square against the exact target
// distribution), including that the test rejects biased rules; token trees:
// malformed parents refused, the greedy walk, the sampling walk lossless
// (chi-square over random trees) and a first-child-preferring walk caught.
#include "worker/spec/verifier.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/sampling/philox.h"
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

TEST(VerifierTest, ArgmaxVerificationGivesTheGreedyChainsTokens) {
  // The device path sees only each row's argmax; it must emit what
  // VerifyChain emits for a greedy target, and count the same tokens.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> logit(-3, 3);
  std::uniform_int_distribution<int> token(0, 3);
  for (int trial = 0; trial < 200; ++trial) {
    const int k = 1 + trial % 4;
    std::vector<float> logits((k + 1) * 4);
    for (float& v : logits) v = logit(rng);
    std::vector<int32_t> argmax;
    for (int r = 0; r <= k; ++r) {
      argmax.push_back(static_cast<int32_t>(
          std::max_element(logits.begin() + r * 4, logits.begin() + (r + 1) * 4) -
          (logits.begin() + r * 4)));
    }
    std::vector<TokenId> draft;
    for (int i = 0; i < k; ++i) draft.push_back(trial % 3 == 0 ? argmax[i] : token(rng));
    sampling::TokenCounts host_counts, device_counts;
    auto host = VerifyChain(logits, 4, draft, {}, Greedy(), &host_counts, 5);
    ASSERT_TRUE(host.ok()) << host.status();
    VerifyResult device = VerifyChainArgmax(draft, argmax, &device_counts);
    EXPECT_EQ(device.tokens, host->tokens) << "trial " << trial;
    EXPECT_EQ(device.num_accepted, host->num_accepted) << "trial " << trial;
    ASSERT_EQ(device_counts.counts().size(), host_counts.counts().size());
    for (const auto& [t, c] : host_counts.counts()) {
      EXPECT_EQ(device_counts.counts().at(t).output, c.output) << "token " << t;
    }
  }
}

TEST(VerifierTest, VerifyDraftPicksTheRuleByShapeAndNamesTheRows) {
  // Argmaxes per row: 2, 0, 3, 1.
  std::vector<float> logits = Rows({{0, 1, 5, 2}, {9, 1, 0, 2}, {0, 1, 2, 3}, {0, 4, 1, 1}});
  sampling::TokenCounts counts;
  Draft chain;
  chain.tokens = {2, 0, 3, 9};  // only the first 3 nodes are verified
  auto r = VerifyDraft(logits, 4, chain, 3, Greedy(), &counts, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->tokens, ElementsAre(2, 0, 3, 1));
  EXPECT_TRUE(r->path.empty());
  EXPECT_EQ(LogitsRowOf(*r, 3), 3);
  // A tree: nodes 0 (token 1) and 1 (token 2) under the root, node 2 (token
  // 3) under node 1. Greedy: row 0 picks 2 (node 1), row 2 (node 1's) picks
  // 3 (node 2, a leaf), whose row 3 gives the bonus token 1.
  Draft tree;
  tree.tokens = {1, 2, 3};
  tree.parents = {-1, -1, 1};
  r = VerifyDraft(logits, 4, tree, 3, Greedy(), &counts, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->tokens, ElementsAre(2, 3, 1));
  EXPECT_THAT(r->path, ElementsAre(1, 2));
  EXPECT_EQ(LogitsRowOf(*r, 0), 0);
  EXPECT_EQ(LogitsRowOf(*r, 1), 2);
  EXPECT_EQ(LogitsRowOf(*r, 2), 3);
  EXPECT_FALSE(VerifyDraft(logits, 4, tree, 4, Greedy(), &counts, 0).ok());
}

TEST(VerifierTest, MalformedTreesAreRefusedWithAClearError) {
  Draft d;
  d.tokens = {1, 2, 3};
  struct Bad {
    std::vector<int32_t> parents;
    const char* message;
  };
  for (const Bad& bad : {Bad{{-1, 1, 0}, "node 1 has parent 1"},    // itself
                         Bad{{-1, 2, 0}, "node 1 has parent 2"},    // a later node
                         Bad{{0, -1, 0}, "node 0 has parent 0"},    // the first node
                         Bad{{-1, -2, 0}, "node 1 has parent -2"},  // below -1
                         Bad{{-1, 0}, "parents has 2 entries for 3"}}) {
    d.parents = bad.parents;
    absl::Status s = ValidateDraft(d, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.message;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(bad.message));
  }
  d.tokens = {1, 1, 3};
  d.parents = {-1, -1, 0};
  EXPECT_THAT(std::string(ValidateDraft(d, 4).message()), ::testing::HasSubstr("siblings"));
  d.parents = {-1, 0, 0};
  EXPECT_TRUE(ValidateDraft(d, 4).ok());
  // VerifyTree checks on its own too.
  sampling::TokenCounts counts;
  std::vector<float> rows(4 * 4, 0.0f);
  EXPECT_FALSE(VerifyTree(rows, 4, {1, 1, 3}, {-1, 2, 0}, Greedy(), &counts, 0).ok());
  EXPECT_FALSE(VerifyTree(rows, 4, {1, 1, 3}, {-1, 0}, Greedy(), &counts, 0).ok());
  EXPECT_FALSE(VerifyTree(absl::MakeConstSpan(rows).first(12), 4, {1, 1, 3}, {-1, 0, 0}, Greedy(),
                          &counts, 0)
                   .ok());
}

TEST(VerifierTest, TreeHelpers) {
  Draft d;
  d.base_len = 10;
  d.tokens = {5, 6, 7, 8, 9};
  d.parents = {-1, -1, 0, 2, 1};
  d.q = {{{5}, {1.0f}}, {{6}, {1.0f}}, {{7}, {1.0f}}, {{8}, {1.0f}}, {{9}, {1.0f}}};
  EXPECT_FALSE(IsChain(d));
  Draft chain = FirstChildChain(d);
  EXPECT_THAT(chain.tokens, ElementsAre(5, 7, 8));
  EXPECT_TRUE(chain.parents.empty());
  ASSERT_EQ(chain.q.size(), 3u);
  EXPECT_EQ(chain.q[1].tokens[0], 7);
  Draft below = SubtreeBelow(d, 0);
  EXPECT_EQ(below.base_len, 11);
  EXPECT_THAT(below.tokens, ElementsAre(7, 8));
  EXPECT_TRUE(below.parents.empty());
  d.parents = {-1, 0, 0, 1};
  d.tokens = {5, 6, 7, 8};
  d.q.clear();
  below = SubtreeBelow(d, 0);
  EXPECT_THAT(below.tokens, ElementsAre(6, 7, 8));
  EXPECT_THAT(below.parents, ElementsAre(-1, -1, 0));
}

TEST(VerifierTest, GreedyTreeWalkFollowsTheArgmax) {
  // Row 0 (the context) argmax 2; node rows: 0:(2) argmax 0, 1:(1) argmax 3,
  // 2:(0 under 0) argmax 1, 3:(3 under 0) argmax 1.
  const std::vector<int32_t> parents = {-1, -1, 0, 0};
  std::vector<float> logits =
      Rows({{0, 1, 5, 2}, {9, 1, 0, 2}, {0, 1, 2, 3}, {0, 4, 1, 1}, {0, 4, 1, 1}});
  sampling::TokenCounts counts;
  auto r = VerifyTree(logits, 4, {2, 1, 0, 3}, parents, Greedy(), &counts, 10);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->tokens, ElementsAre(2, 0, 1));  // 2 and 0 accepted, then a bonus from node 2
  EXPECT_THAT(r->path, ElementsAre(0, 2));
  EXPECT_EQ(r->num_accepted, 2);
  // The argmax of the context is no child: it is emitted alone.
  r = VerifyTree(logits, 4, {1, 3, 0, 2}, parents, Greedy(), &counts, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->tokens, ElementsAre(2));
  EXPECT_TRUE(r->path.empty());
  // The second root candidate matches.
  r = VerifyTree(logits, 4, {1, 2, 0, 3}, parents, Greedy(), &counts, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->tokens, ElementsAre(2, 3));  // node 1's row: argmax 3
  EXPECT_THAT(r->path, ElementsAre(1));
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
  EXPECT_TRUE(ValidateDraft(d, 4).ok());  // a tree: two candidates for one position
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

// ---- Token trees at temperature > 0 ----
//
// A synthetic model: the logits of the next token depend on the last two
// tokens. Generation runs speculative steps with random trees (shapes and
// tokens from a test RNG, independent of the request seed) until three
// tokens are out; the joint distribution of those three over many seeds
// must equal the model's (with the same processing: temperature, top-p,
// presence penalty on the counts).
constexpr int kTreeVocab = 4;

std::vector<float> SyntheticLogits(const std::vector<TokenId>& context) {
  const int a = context[context.size() - 2], b = context.back();
  std::vector<float> row(kTreeVocab);
  for (int v = 0; v < kTreeVocab; ++v) {
    row[v] = 1.4f * std::sin(1.3f * v + 0.7f * a + 1.9f * b + 0.3f * v * b);
  }
  return row;
}

// A walk: (rows, tokens, parents, params, counts, position) -> emitted tokens.
using Walk = std::function<std::vector<TokenId>(
    absl::Span<const float>, absl::Span<const TokenId>, absl::Span<const int32_t>,
    const sampling::SamplingParams&, sampling::TokenCounts*, int64_t)>;

std::vector<TokenId> RightWalk(absl::Span<const float> rows, absl::Span<const TokenId> tokens,
                               absl::Span<const int32_t> parents,
                               const sampling::SamplingParams& params,
                               sampling::TokenCounts* counts, int64_t position) {
  auto r = VerifyTree(rows, kTreeVocab, tokens, parents, params, counts, position);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<TokenId>{0};
}

// Deliberately wrong: at each node the first child is taken with the
// target's probability of its token (from an extra uniform), and only
// otherwise is a token drawn and matched. The first child's token then
// comes out with probability p + (1 - p) p.
std::vector<TokenId> FirstChildWalk(absl::Span<const float> rows, absl::Span<const TokenId> tokens,
                                    absl::Span<const int32_t> parents,
                                    const sampling::SamplingParams& params,
                                    sampling::TokenCounts* counts, int64_t position) {
  std::vector<TokenId> out;
  int32_t at = -1;
  for (int64_t depth = 0;; ++depth) {
    absl::Span<const float> row = rows.subspan((at + 1) * kTreeVocab, kTreeVocab);
    int32_t first = -1;
    for (size_t i = 0; i < tokens.size() && first < 0; ++i) {
      if (parents[i] == at) first = static_cast<int32_t>(i);
    }
    if (first >= 0) {
      auto p = sampling::ComputeSamplingDistribution(row, params, *counts);
      double pf = 0;
      for (size_t j = 0; j < p->tokens.size(); ++j) {
        if (p->tokens[j] == tokens[first]) pf = p->probs[j];
      }
      const double u = sampling::UniformFromSeed(params.seed, position + depth,
                                                 sampling::RandomStream::kSpeculativeAccept);
      if (u < pf) {
        out.push_back(tokens[first]);
        counts->AddOutput(tokens[first]);
        at = first;
        continue;
      }
    }
    auto drawn = sampling::Sample(row, params, *counts, position + depth);
    out.push_back(drawn->token);
    counts->AddOutput(drawn->token);
    int32_t next = -1;
    for (size_t i = at + 1; i < tokens.size() && next < 0; ++i) {
      if (parents[i] == at && tokens[i] == drawn->token) next = static_cast<int32_t>(i);
    }
    if (next < 0) return out;
    at = next;
  }
}

sampling::SamplingParams TreeParams(bool penalties) {
  sampling::SamplingParams p;
  p.temperature = penalties ? 0.8f : 1.0f;
  p.top_p = penalties ? 0.95f : 1.0f;
  p.presence_penalty = penalties ? 0.7f : 0.0f;
  return p;
}

std::vector<double> ExactTreeJoint(const std::vector<TokenId>& prompt,
                                   const sampling::SamplingParams& params) {
  std::vector<double> joint(kTreeVocab * kTreeVocab * kTreeVocab);
  auto dist = [&](const std::vector<TokenId>& context) {
    sampling::TokenCounts counts;
    counts.AddPrompt(prompt);
    for (size_t i = prompt.size(); i < context.size(); ++i) counts.AddOutput(context[i]);
    auto d = sampling::ComputeSamplingDistribution(SyntheticLogits(context), params, counts);
    std::vector<double> p(kTreeVocab);
    for (size_t i = 0; i < d->tokens.size(); ++i) p[d->tokens[i]] = d->probs[i];
    return p;
  };
  const auto p1 = dist(prompt);
  for (int a = 0; a < kTreeVocab; ++a) {
    std::vector<TokenId> ca = prompt;
    ca.push_back(a);
    const auto p2 = dist(ca);
    for (int b = 0; b < kTreeVocab; ++b) {
      std::vector<TokenId> cb = ca;
      cb.push_back(b);
      const auto p3 = dist(cb);
      for (int c = 0; c < kTreeVocab; ++c) {
        joint[(a * kTreeVocab + b) * kTreeVocab + c] = p1[a] * p2[b] * p3[c];
      }
    }
  }
  return joint;
}

std::vector<int64_t> TreeHistogram(const Walk& walk, const std::vector<TokenId>& prompt,
                                   const sampling::SamplingParams& base, int n, int64_t* accepted) {
  std::mt19937 tree_rng(99);
  std::vector<int64_t> hist(kTreeVocab * kTreeVocab * kTreeVocab);
  *accepted = 0;
  for (int trial = 0; trial < n; ++trial) {
    sampling::SamplingParams params = base;
    params.seed = 5000 + trial;
    sampling::TokenCounts counts;
    counts.AddPrompt(prompt);
    std::vector<TokenId> seq = prompt;
    while (seq.size() < prompt.size() + 3) {
      // A random tree of 1..6 nodes, siblings with distinct tokens, first
      // children usually the guess.
      std::vector<TokenId> tokens;
      std::vector<int32_t> parents;
      const int nodes = 1 + static_cast<int>(tree_rng() % 6);
      for (int i = 0; i < nodes; ++i) {
        const int32_t parent = static_cast<int32_t>(tree_rng() % (tokens.size() + 1)) - 1;
        // Mostly a fixed guess from the parent's token (a draft model's
        // habit), else any token.
        const TokenId before = parent < 0 ? seq.back() : tokens[parent];
        const TokenId token = tree_rng() % 4 != 0 ? (before + 1) % kTreeVocab
                                                  : static_cast<TokenId>(tree_rng() % kTreeVocab);
        bool dup = false;
        for (size_t j = 0; j < tokens.size(); ++j)
          dup |= parents[j] == parent && tokens[j] == token;
        if (dup) continue;
        parents.push_back(parent);
        tokens.push_back(token);
      }
      // Rows: the context, then each node's root-to-node path.
      std::vector<float> rows = SyntheticLogits(seq);
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::vector<TokenId> path;
        for (int32_t k = static_cast<int32_t>(i); k >= 0; k = parents[k]) {
          path.insert(path.begin(), tokens[k]);
        }
        std::vector<TokenId> context = seq;
        context.insert(context.end(), path.begin(), path.end());
        const std::vector<float> r = SyntheticLogits(context);
        rows.insert(rows.end(), r.begin(), r.end());
      }
      const std::vector<TokenId> out =
          walk(rows, tokens, parents, params, &counts, static_cast<int64_t>(seq.size()));
      *accepted += static_cast<int64_t>(out.size()) - 1;
      seq.insert(seq.end(), out.begin(), out.end());
    }
    const size_t p = prompt.size();
    ++hist[(seq[p] * kTreeVocab + seq[p + 1]) * kTreeVocab + seq[p + 2]];
  }
  return hist;
}

TEST(VerifierTest, TreeWalkIsLosslessAndTheTestCatchesAWrongWalk) {
  constexpr int kSamples = 40000;
  const std::vector<TokenId> prompt = {1, 3, 0};
  for (bool penalties : {false, true}) {
    const sampling::SamplingParams params = TreeParams(penalties);
    const std::vector<double> exact = ExactTreeJoint(prompt, params);
    int64_t accepted = 0;
    ChiSquareResult right = ChiSquareGoodnessOfFit(
        TreeHistogram(RightWalk, prompt, params, kSamples, &accepted), exact);
    EXPECT_GT(accepted, kSamples / 2) << "the trees were accepted from at times";
    EXPECT_GT(right.p_value, kAlpha)
        << "chi2=" << right.statistic << " df=" << right.degrees_of_freedom;
    ChiSquareResult wrong = ChiSquareGoodnessOfFit(
        TreeHistogram(FirstChildWalk, prompt, params, kSamples, &accepted), exact);
    EXPECT_LT(wrong.p_value, kAlpha)
        << "chi2=" << wrong.statistic << " df=" << wrong.degrees_of_freedom;
    std::cout << (penalties ? "penalties: " : "plain: ") << "walk p=" << right.p_value
              << ", first-child walk p=" << wrong.p_value << "\n";
  }
}

TEST(VerifierTest, TreeWalkEmitsWhatPlainDecodingDrawsWithTheSameSeed) {
  // Each emitted token is sampling::Sample's draw at its position: with one
  // seed, the walk's output equals plain decoding token by token.
  const std::vector<TokenId> prompt = {2, 2, 1};
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    sampling::SamplingParams params = TreeParams(trial % 2 == 1);
    params.seed = 77 + trial;
    sampling::TokenCounts plain_counts;
    plain_counts.AddPrompt(prompt);
    std::vector<TokenId> plain = prompt;
    for (int i = 0; i < 3; ++i) {
      auto s = sampling::Sample(SyntheticLogits(plain), params, plain_counts,
                                static_cast<int64_t>(plain.size()));
      plain_counts.AddOutput(s->token);
      plain.push_back(s->token);
    }
    // A chain of the first two plain tokens plus a wrong sibling: the walk
    // accepts both and draws the third from node 1's row.
    const std::vector<TokenId> tokens = {static_cast<TokenId>((plain[3] + 1) % kTreeVocab),
                                         plain[3], plain[4]};
    const std::vector<int32_t> parents = {-1, -1, 1};
    std::vector<float> rows = SyntheticLogits(prompt);
    for (const std::vector<TokenId>& path :
         {std::vector<TokenId>{tokens[0]}, std::vector<TokenId>{plain[3]},
          std::vector<TokenId>{plain[3], plain[4]}}) {
      std::vector<TokenId> c = prompt;
      c.insert(c.end(), path.begin(), path.end());
      const auto r = SyntheticLogits(c);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    sampling::TokenCounts counts;
    counts.AddPrompt(prompt);
    auto r = VerifyTree(rows, kTreeVocab, tokens, parents, params, &counts, 3);
    ASSERT_TRUE(r.ok());
    EXPECT_THAT(r->tokens, ElementsAre(plain[3], plain[4], plain[5]));
    EXPECT_THAT(r->path, ElementsAre(1, 2));
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
