// Draft sources: n-gram lookup, the suffix automaton (own tokens and the
// shared history), and the draft model (batched proposals, run-ahead and
// rollback agreeing with a fresh source); token trees from each (branching
// where earlier occurrences continue differently, the draft model's
// runner-up tokens as siblings), within the node and branching bounds.
#include <cstdlib>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"
#include "worker/spec/model_source.h"
#include "worker/spec/verifier.h"

namespace tessera::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

sampling::SamplingParams Greedy() {
  sampling::SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(NgramSourceTest, ProposesWhatFollowedTheLatestMatch) {
  auto src = MakeNgramSource();
  ASSERT_TRUE(src->Open(1, {5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6}, Greedy()).ok());
  std::vector<Draft> d = src->Propose({{1, 3}});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].base_len, 11);
  // "5 6" last occurred at index 5, followed by 7 1 5.
  EXPECT_THAT(d[0].tokens, ElementsAre(7, 1, 5));
  ASSERT_TRUE(src->Update(1, 11, {7, 8}).ok());
  d = src->Propose({{1, 2}});
  EXPECT_THAT(d[0].tokens, ElementsAre(9, 5));  // "5 6 7 8" matched at 0
  // No repeat, unknown sequence, zero budget: empty.
  ASSERT_TRUE(src->Open(2, {1, 2, 3}, Greedy()).ok());
  d = src->Propose({{2, 4}, {99, 4}, {1, 0}});
  EXPECT_THAT(d[0].tokens, IsEmpty());
  EXPECT_THAT(d[1].tokens, IsEmpty());
  EXPECT_THAT(d[2].tokens, IsEmpty());
  EXPECT_FALSE(src->Update(2, 10, {1}).ok());
  EXPECT_FALSE(src->Open(2, {1}, Greedy()).ok());
  EXPECT_FALSE(src->Open(3, {}, Greedy()).ok());
}

TEST(SuffixSourceTest, LongestRepeatedSuffixAndSharedHistory) {
  auto src = MakeSuffixSource();
  ASSERT_TRUE(src->Open(1, {1, 2, 3, 4, 9, 2, 3, 4, 7, 1, 2, 3, 4}, Greedy()).ok());
  // Longest repeated suffix "1 2 3 4" (at 0), followed by 9 2 3.
  EXPECT_THAT(src->Propose({{1, 3}})[0].tokens, ElementsAre(9, 2, 3));
  ASSERT_TRUE(src->Update(1, 13, {9}).ok());
  EXPECT_THAT(src->Propose({{1, 2}})[0].tokens, ElementsAre(2, 3));
  // A finished sequence becomes history for new ones.
  src->Close(1);
  ASSERT_TRUE(src->Open(2, {40, 41, 7, 1, 2}, Greedy()).ok());
  EXPECT_THAT(src->Propose({{2, 3}})[0].tokens, ElementsAre(3, 4, 9));
  // Truncation below the indexed tokens rebuilds the automaton.
  ASSERT_TRUE(src->Update(2, 2, {40, 41}).ok());
  EXPECT_EQ(src->Length(2), 4);
  EXPECT_THAT(src->Propose({{2, 2}})[0].tokens, ElementsAre(40, 41));
}

TEST(NgramSourceTest, TreesBranchWhereOccurrencesContinueDifferently) {
  NgramOptions o;
  o.tree.max_branching = 2;
  auto src = MakeNgramSource(o);
  // "5 6" is followed by 7 9 5 6 at 0 and by 8 1 5 6 at 4 (the latest).
  const std::vector<TokenId> seq = {5, 6, 7, 9, 5, 6, 8, 1, 5, 6};
  ASSERT_TRUE(src->Open(1, seq, Greedy()).ok());
  Draft d = src->Propose({{1, 4}})[0];
  EXPECT_EQ(d.base_len, 10);
  // Best first: 8 (latest, the first child), 7, then each one's next token.
  EXPECT_THAT(d.tokens, ElementsAre(8, 7, 1, 9));
  EXPECT_THAT(d.parents, ElementsAre(-1, -1, 0, 1));
  EXPECT_TRUE(ValidateDraft(d, 16).ok());
  EXPECT_THAT(FirstChildChain(d).tokens, ElementsAre(8, 1));
  // One node: the best guess only.
  d = src->Propose({{1, 1}})[0];
  EXPECT_THAT(d.tokens, ElementsAre(8));
  EXPECT_TRUE(d.parents.empty());
  // Three continuations, branching 2: at most two children per node.
  ASSERT_TRUE(src->Update(1, 10, {3, 4, 5, 6}).ok());  // "5 6" now also followed by 3 4
  d = src->Propose({{1, 6}})[0];
  ASSERT_EQ(d.tokens.size(), 6u);
  int roots = 0;
  for (int32_t p : d.parents) roots += p == -1;
  EXPECT_EQ(roots, 2);
  EXPECT_TRUE(ValidateDraft(d, 16).ok());
  // A single occurrence gives a chain, as without trees.
  ASSERT_TRUE(src->Open(2, {1, 2, 3, 9, 1, 2}, Greedy()).ok());
  d = src->Propose({{2, 3}})[0];
  EXPECT_THAT(d.tokens, ElementsAre(3, 9, 1));
  EXPECT_TRUE(d.parents.empty());
}

TEST(SuffixSourceTest, TreesJoinTheFirstAndLatestOccurrence) {
  SuffixOptions o;
  o.tree.max_branching = 2;
  auto src = MakeSuffixSource(o);
  // "1 2 3" first followed by 4 9, most recently by 5 1.
  ASSERT_TRUE(src->Open(1, {1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2, 3}, Greedy()).ok());
  Draft d = src->Propose({{1, 4}})[0];
  EXPECT_THAT(d.tokens, ElementsAre(4, 5, 9, 1));
  EXPECT_THAT(d.parents, ElementsAre(-1, -1, 0, 1));
  EXPECT_TRUE(ValidateDraft(d, 16).ok());
  // Without trees the first occurrence's chain, as before.
  auto chain = MakeSuffixSource();
  ASSERT_TRUE(chain->Open(1, {1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2, 3}, Greedy()).ok());
  EXPECT_THAT(chain->Propose({{1, 3}})[0].tokens, ElementsAre(4, 9, 1));
  EXPECT_TRUE(chain->Propose({{1, 3}})[0].parents.empty());
}

class ModelSourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = "/tmp/tessera-spec-XXXXXX";
    dir_ = new std::string(mkdtemp(pattern.data()));
    runner::TestModelSpec spec;
    spec.vocab = 64;
    spec.hidden = 32;
    spec.intermediate = 64;
    spec.layers = 1;
    spec.heads = 2;
    spec.kv_heads = 1;
    spec.head_dim = 16;
    ASSERT_TRUE(runner::WriteTestModel(*dir_, spec).ok());
  }
  std::unique_ptr<DraftSource> Make(int blocks = 64, TreeOptions tree = {}) {
    ModelSourceFromDirOptions o;
    o.block_size = 4;
    o.num_kv_blocks = blocks;
    o.source.tree = tree;
    auto s = MakeModelSourceFromDir(*dir_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  static std::string* dir_;
};
std::string* ModelSourceTest::dir_ = nullptr;

TEST_F(ModelSourceTest, RunAheadAndRollbackMatchAFreshSource) {
  auto a = Make();
  std::mt19937 rng(3);
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<TokenId> p(3 + i * 5);
    for (auto& t : p) t = static_cast<TokenId>(rng() % 64);
    prompts.push_back(p);
    ASSERT_TRUE(a->Open(i, p, Greedy()).ok());
  }
  std::vector<DraftQuery> q;
  for (int i = 0; i < 4; ++i) q.push_back({static_cast<SeqKey>(i), 5});
  for (int round = 0; round < 6; ++round) {
    std::vector<Draft> drafts = a->Propose(q);
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(drafts[i].tokens.size(), 5u);
      EXPECT_TRUE(drafts[i].q.empty());  // greedy: one-hot
      // A fresh source over the same tokens proposes the same (greedy).
      auto b = Make();
      std::vector<TokenId> all = prompts[i];
      ASSERT_TRUE(b->Open(99, all, Greedy()).ok());
      EXPECT_EQ(b->Propose({{99, 5}})[0].tokens, drafts[i].tokens) << "round " << round;
      // Commit: accept a prefix of varying length, then a different token.
      const int accept = (round + i) % 6;
      std::vector<TokenId> commit(drafts[i].tokens.begin(),
                                  drafts[i].tokens.begin() + std::min(accept, 5));
      commit.push_back(static_cast<TokenId>((round * 7 + i) % 64));
      ASSERT_TRUE(a->Update(i, drafts[i].base_len, commit).ok());
      prompts[i].insert(prompts[i].end(), commit.begin(), commit.end());
      EXPECT_EQ(a->Length(i), static_cast<int64_t>(prompts[i].size()));
    }
  }
}

TEST_F(ModelSourceTest, SamplingDraftsCarryTheirDistribution) {
  auto a = Make();
  sampling::SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 11;
  ASSERT_TRUE(a->Open(1, {1, 2, 3}, p).ok());
  Draft d = a->Propose({{1, 4}})[0];
  ASSERT_EQ(d.tokens.size(), 4u);
  ASSERT_EQ(d.q.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    double total = 0, own = 0;
    for (size_t j = 0; j < d.q[i].tokens.size(); ++j) {
      total += d.q[i].probs[j];
      if (d.q[i].tokens[j] == d.tokens[i]) own = d.q[i].probs[j];
    }
    EXPECT_NEAR(total, 1.0, 1e-4);
    EXPECT_GT(own, 0);
    EXPECT_LE(d.q[i].tokens.size(), 64u);
  }
}

TEST_F(ModelSourceTest, TreesAddRunnersUpAsSiblings) {
  TreeOptions tree;
  tree.max_branching = 2;
  tree.branch_depth = 2;
  auto t = Make(64, tree);
  auto c = Make();
  const std::vector<TokenId> prompt = {4, 9, 17, 33, 2};
  ASSERT_TRUE(t->Open(1, prompt, Greedy()).ok());
  ASSERT_TRUE(c->Open(1, prompt, Greedy()).ok());
  // 6 nodes: a chain of 4 and a sibling at depths 1 and 2 (a third).
  Draft d = t->Propose({{1, 6}})[0];
  const std::vector<TokenId> chain = c->Propose({{1, 4}})[0].tokens;
  ASSERT_EQ(d.tokens.size(), 6u);
  EXPECT_EQ(std::vector<TokenId>(d.tokens.begin(), d.tokens.begin() + 4), chain);
  EXPECT_THAT(d.parents, ElementsAre(-1, 0, 1, 2, -1, 0));
  EXPECT_NE(d.tokens[4], d.tokens[0]);
  EXPECT_NE(d.tokens[5], d.tokens[1]);
  EXPECT_TRUE(ValidateDraft(d, 64).ok());
  EXPECT_EQ(FirstChildChain(d).tokens, chain);
  // Only the chain runs ahead.
  EXPECT_EQ(t->Length(1), static_cast<int64_t>(prompt.size() + 4));
  // Sampled drafts: q per node, the sibling's q giving it probability.
  sampling::SamplingParams p;
  p.temperature = 0.9f;
  p.seed = 5;
  ASSERT_TRUE(t->Open(2, prompt, p).ok());
  d = t->Propose({{2, 4}})[0];
  ASSERT_EQ(d.tokens.size(), 4u);
  ASSERT_EQ(d.q.size(), 4u);
  EXPECT_TRUE(ValidateDraft(d, 64).ok());
  EXPECT_THAT(d.parents, ElementsAre(-1, 0, 1, -1));
  // Two tokens: no room for siblings.
  ASSERT_TRUE(t->Open(3, prompt, Greedy()).ok());
  d = t->Propose({{3, 2}})[0];
  EXPECT_EQ(d.tokens.size(), 2u);
  EXPECT_TRUE(d.parents.empty());
}

TEST_F(ModelSourceTest, ShortPoolStillProposesForWhatFits) {
  auto a = Make(/*blocks=*/6);  // 24 slots
  ASSERT_TRUE(a->Open(1, std::vector<TokenId>(10, 3), Greedy()).ok());
  ASSERT_TRUE(a->Open(2, std::vector<TokenId>(10, 4), Greedy()).ok());
  std::vector<Draft> d = a->Propose({{1, 4}, {2, 4}});
  EXPECT_EQ(d[0].tokens.size() + d[1].tokens.size() > 0, true);
  EXPECT_FALSE(MakeModelSourceFromDir("/nonexistent/dir").ok());
}

}  // namespace
}  // namespace tessera::spec
