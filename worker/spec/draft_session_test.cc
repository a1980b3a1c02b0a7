// DraftSession's rounds: proposals go out before the run-ahead, a failed
// send stops the round, and a commit matching the run-ahead is answered
// without drafting again.
#include "worker/spec/draft_session.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::spec {
namespace {

using ::testing::ElementsAre;

// Proposes the next token ids (last + 1, + 2, ...) and keeps them, as a
// draft model runs ahead; counts its Propose calls.
class CountingSource final : public DraftSource {
 public:
  std::string name() const override { return "counting"; }
  bool runs_ahead() const override { return true; }
  absl::Status Open(SeqKey seq, absl::Span<const TokenId> tokens,
                    const sampling::SamplingParams&) override {
    if (tokens.empty()) return absl::InvalidArgumentError("empty");
    seqs_[seq].assign(tokens.begin(), tokens.end());
    return absl::OkStatus();
  }
  absl::Status Update(SeqKey seq, int64_t base_len, absl::Span<const TokenId> tokens) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return absl::NotFoundError("unknown");
    if (base_len > static_cast<int64_t>(it->second.size())) {
      return absl::InvalidArgumentError("base");
    }
    it->second.resize(base_len);
    it->second.insert(it->second.end(), tokens.begin(), tokens.end());
    return absl::OkStatus();
  }
  void Close(SeqKey seq) override { seqs_.erase(seq); }
  int64_t Length(SeqKey seq) const override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? -1 : static_cast<int64_t>(it->second.size());
  }
  std::vector<Draft> Propose(absl::Span<const DraftQuery> queries) override {
    ++proposes;
    std::vector<Draft> out(queries.size());
    for (size_t i = 0; i < queries.size(); ++i) {
      auto it = seqs_.find(queries[i].seq);
      if (it == seqs_.end()) continue;
      out[i].base_len = static_cast<int64_t>(it->second.size());
      for (int j = 0; j < queries[i].max_tokens; ++j) {
        const TokenId next = it->second.back() + 1;
        out[i].tokens.push_back(next);
        it->second.push_back(next);
      }
    }
    return out;
  }
  int proposes = 0;

 private:
  absl::flat_hash_map<SeqKey, std::vector<TokenId>> seqs_;
};

TEST(DraftSessionTest, ARoundSendsThenRunsAheadAndAMatchingCommitIsAnsweredAtOnce) {
  CountingSource source;
  DraftSession session(&source, /*max_draft_tokens=*/3);
  session.Open(1, {10, 11}, {}, 2);
  std::vector<DraftSession::Proposals> sent;
  auto send = [&](const DraftSession::Proposals& p) {
    EXPECT_EQ(source.proposes, 1) << "sent before the run-ahead";
    sent.push_back(p);
    return true;
  };
  ASSERT_TRUE(session.Round(send));
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(sent[0].size(), 1u);
  EXPECT_EQ(sent[0][0].second.base_len, 2);
  EXPECT_THAT(sent[0][0].second.tokens, ElementsAre(12, 13));
  EXPECT_EQ(source.proposes, 2);  // the run-ahead: bonus 14, then 15, 16
  EXPECT_EQ(session.proposals_sent(), 1);

  // The worker accepts both drafts and its bonus token is the guessed 14.
  session.Commit(1, 2, {12, 13, 14}, 0);
  sent.clear();
  auto send_again = [&](const DraftSession::Proposals& p) {
    sent.push_back(p);
    return true;
  };
  ASSERT_TRUE(session.Round(send_again));
  EXPECT_EQ(session.run_ahead_hits(), 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0][0].second.base_len, 5);
  EXPECT_THAT(sent[0][0].second.tokens, ElementsAre(15, 16));
  EXPECT_EQ(source.proposes, 3);  // only the next run-ahead drafted
}

TEST(DraftSessionTest, AFailedSendStopsTheRoundBeforeTheRunAhead) {
  CountingSource source;
  DraftSession session(&source, 4);
  session.Open(7, {1}, {}, 2);
  EXPECT_FALSE(session.Round([](const DraftSession::Proposals&) { return false; }));
  EXPECT_EQ(source.proposes, 1);
  EXPECT_EQ(session.proposals_sent(), 0);
  // Nothing changed since: a round has nothing to send.
  int calls = 0;
  EXPECT_TRUE(session.Round([&](const DraftSession::Proposals&) { return ++calls > 0; }));
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace tessera::spec
