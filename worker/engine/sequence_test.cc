#include "worker/engine/sequence.h"

#include "gtest/gtest.h"

namespace tessera::engine {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(SequenceTest, PromptAndOutputShareOneTokenList) {
  SamplingOptions opts;
  opts.max_tokens = 10;
  Sequence seq(7, {1, 2, 3}, {4, 5}, opts, kT0, 0);
  EXPECT_EQ(seq.id(), 7u);
  EXPECT_EQ(seq.num_prompt_tokens(), 3);
  EXPECT_EQ(seq.num_output_tokens(), 2);
  EXPECT_EQ(seq.num_resumed_output_tokens(), 2);
  EXPECT_EQ(seq.num_tokens(), 5);
  EXPECT_EQ(std::vector<TokenId>(seq.output_token_ids().begin(), seq.output_token_ids().end()),
            (std::vector<TokenId>{4, 5}));
  EXPECT_EQ(seq.num_uncomputed_tokens(), 5);
  EXPECT_EQ(seq.status(), SequenceStatus::kWaiting);
  seq.AppendToken(6, kT0 + absl::Seconds(1));
  EXPECT_EQ(seq.last_token_id(), 6);
  EXPECT_EQ(seq.times().first_token, kT0 + absl::Seconds(1));
}

TEST(SequenceTest, GivenOutputTokensNeverTriggerStops) {
  SamplingOptions opts;
  opts.max_tokens = 10;
  opts.eos_token_ids = {5};
  Sequence seq(1, {1, 2}, {5}, opts, kT0, 0);
  EXPECT_EQ(seq.CheckStop(100), FinishReason::kNone);
  seq.AppendToken(5, kT0);
  EXPECT_EQ(seq.CheckStop(100), FinishReason::kStop);
}

TEST(SequenceTest, StopConditions) {
  SamplingOptions opts;
  opts.max_tokens = 3;
  opts.eos_token_ids = {9};
  opts.stop_token_ids = {8};
  {
    Sequence seq(1, {1}, {}, opts, kT0, 0);
    seq.AppendToken(2, kT0);
    EXPECT_EQ(seq.CheckStop(100), FinishReason::kNone);
    seq.AppendToken(9, kT0);
    EXPECT_EQ(seq.CheckStop(100), FinishReason::kStop);
  }
  {
    SamplingOptions ignore = opts;
    ignore.ignore_eos = true;
    Sequence seq(1, {1}, {}, ignore, kT0, 0);
    seq.AppendToken(9, kT0);
    EXPECT_EQ(seq.CheckStop(100), FinishReason::kNone);
    seq.AppendToken(8, kT0);  // stop ids apply even with ignore_eos
    EXPECT_EQ(seq.CheckStop(100), FinishReason::kStop);
  }
  {
    Sequence seq(1, {1}, {}, opts, kT0, 0);
    for (int i = 0; i < 3; ++i) seq.AppendToken(2, kT0);
    EXPECT_EQ(seq.CheckStop(100), FinishReason::kLength);
  }
  {
    Sequence seq(1, {1, 1, 1}, {}, opts, kT0, 0);
    seq.AppendToken(2, kT0);
    EXPECT_EQ(seq.CheckStop(4), FinishReason::kLength);  // context full
  }
}

TEST(SequenceTest, PreemptKeepsTokensAndDropsKv) {
  SamplingOptions opts;
  Sequence seq(1, {1, 2, 3}, {}, opts, kT0, 0);
  seq.set_status(SequenceStatus::kRunning);
  seq.set_num_computed_tokens(3);
  seq.RecordCachedTokens(2);
  seq.AppendToken(4, kT0);
  seq.Preempt();
  EXPECT_EQ(seq.status(), SequenceStatus::kPreempted);
  EXPECT_EQ(seq.num_computed_tokens(), 0);
  EXPECT_EQ(seq.num_tokens(), 4);
  EXPECT_EQ(seq.num_preemptions(), 1);
  seq.RecordCachedTokens(3);  // a re-admission does not change the usage figure
  EXPECT_EQ(seq.num_cached_tokens(), 2);
}

TEST(SequenceTest, Names) {
  EXPECT_EQ(SequenceStatusName(SequenceStatus::kPreempted), "preempted");
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kAbort), "abort");
  EXPECT_EQ(FinishReasonName(FinishReason::kNone), "");
}

}  // namespace
}  // namespace tessera::engine
