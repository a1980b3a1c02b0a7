#include "worker/engine/scheduler.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/fake_model.h"

namespace tessera::engine {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int kVocab = 1000;
const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

SchedulerOptions BaseOptions() {
  SchedulerOptions o;
  o.block_size = 16;
  o.num_blocks = 256;
  o.max_num_batched_tokens = 64;
  o.max_num_seqs = 8;
  o.max_model_len = 2048;
  o.vocab_size = kVocab;
  return o;
}

std::vector<TokenId> RandomTokens(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<TokenId> v(n);
  for (auto& t : v) t = static_cast<TokenId>(rng() % kVocab);
  return v;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

SamplingOptions Opts(int max_tokens, int priority = 0) {
  SamplingOptions o;
  o.max_tokens = max_tokens;
  o.priority = priority;
  return o;
}

// Drives a scheduler with the fake model; checks invariants after each step
// and collects every sequence's output.
class Harness {
 public:
  explicit Harness(SchedulerOptions options)
      : model_(options.num_blocks, options.block_size, options.vocab_size) {
    options.clock = [this] { return now_; };
    auto s = Scheduler::Create(std::move(options));
    EXPECT_TRUE(s.ok()) << s.status();
    scheduler_ = *std::move(s);
  }

  Scheduler& scheduler() { return *scheduler_; }
  const SchedulerOptions& options() const { return scheduler_->options(); }

  absl::Status Add(SequenceId id, std::vector<TokenId> prompt, SamplingOptions opts,
                   std::vector<TokenId> output = {}) {
    return scheduler_->AddSequence(id, std::move(prompt), std::move(opts), std::move(output));
  }

  // Runs one step; returns its batch (empty when there was nothing to do).
  ScheduledBatch Step() {
    absl::StatusOr<ScheduledBatch> batch = scheduler_->Schedule();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok() || batch->empty()) return {};
    auto sampled = model_.Run(*batch, &scheduler_->block_manager());
    EXPECT_TRUE(sampled.ok()) << sampled.status();
    if (!sampled.ok()) return {};
    auto outputs = scheduler_->OnStepDone(*sampled);
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (outputs.ok()) Record(*outputs);
    const absl::Status inv = scheduler_->CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    now_ += absl::Milliseconds(10);
    return *std::move(batch);
  }

  void Record(const std::vector<SequenceOutput>& outputs) {
    for (const SequenceOutput& out : outputs) {
      auto& tokens = generated_[out.id];
      tokens.insert(tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished) finished_[out.id] = out;
    }
  }

  // Steps until nothing is left; returns the batches.
  std::vector<ScheduledBatch> RunUntilIdle(int max_steps = 100000) {
    std::vector<ScheduledBatch> batches;
    while (scheduler_->HasUnfinished() && max_steps-- > 0) batches.push_back(Step());
    EXPECT_FALSE(scheduler_->HasUnfinished());
    return batches;
  }

  const std::vector<TokenId>& generated(SequenceId id) { return generated_[id]; }
  bool finished(SequenceId id) const { return finished_.contains(id); }
  const SequenceOutput& final_output(SequenceId id) { return finished_.at(id); }
  void Advance(absl::Duration d) { now_ += d; }

  std::vector<TokenId> Reference(const std::vector<TokenId>& prompt, const SamplingOptions& opts,
                                 const std::vector<TokenId>& output = {}) const {
    return FakeModel::Reference(prompt, output, opts, scheduler_->options().max_model_len,
                                scheduler_->options().vocab_size);
  }

 private:
  absl::Time now_ = kT0;
  FakeModel model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<SequenceId, std::vector<TokenId>> generated_;
  std::map<SequenceId, SequenceOutput> finished_;
};

TEST(SchedulerTest, RejectsBadOptions) {
  SchedulerOptions o = BaseOptions();
  o.max_num_batched_tokens = 0;
  EXPECT_EQ(Scheduler::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = BaseOptions();
  o.num_blocks = 0;
  EXPECT_EQ(Scheduler::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = BaseOptions();
  o.watermark = 1.5;
  EXPECT_EQ(Scheduler::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, AdmissionRefusesRequestsThatCanNeverRun) {
  SchedulerOptions o = BaseOptions();
  o.num_blocks = 8;  // 128 tokens of KV
  o.max_model_len = 200;
  Harness h(o);
  auto refused = [&](std::vector<TokenId> prompt, SamplingOptions opts,
                     std::vector<TokenId> output = {}) {
    absl::Status s = h.Add(1, std::move(prompt), std::move(opts), std::move(output));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_THAT(refused({}, Opts(4)), HasSubstr("prompt is empty"));
  EXPECT_THAT(refused({1, 2}, Opts(0)), HasSubstr("max_tokens must be positive"));
  EXPECT_THAT(refused({1, kVocab}, Opts(4)), HasSubstr("outside the vocabulary"));
  EXPECT_THAT(refused({1, -3}, Opts(4)), HasSubstr("token id -3 at index 1"));
  EXPECT_THAT(refused({1}, Opts(2), {5, 6}), HasSubstr("already has 2 output tokens"));
  // Longer than the context.
  EXPECT_THAT(refused(RandomTokens(100, 1), Opts(150)),
              HasSubstr("prompt (100 tokens) + max_tokens (150) = 250 exceeds the model's "
                        "context length of 200 tokens"));
  // Prompt alone needs more blocks than the cache has.
  EXPECT_THAT(refused(RandomTokens(129, 1), Opts(1)),
              HasSubstr("the prompt of 129 tokens needs 9 KV blocks of 16 tokens, more than "
                        "the whole cache (8 blocks)"));
  // Prompt fits, but prompt + max_tokens cannot.
  EXPECT_THAT(refused(RandomTokens(100, 1), Opts(40)), HasSubstr("needs up to 9 KV blocks"));
  EXPECT_EQ(h.scheduler().num_waiting(), 0);

  // The largest request that fits is accepted: 129 tokens of KV = 8 blocks.
  EXPECT_TRUE(h.Add(1, RandomTokens(100, 1), Opts(29)).ok());
  EXPECT_EQ(h.Add(1, {1}, Opts(1)).code(), absl::StatusCode::kAlreadyExists);
  h.RunUntilIdle();
  EXPECT_EQ(h.final_output(1).finish_reason, FinishReason::kLength);
}

// A decode verifying a token tree: the accepted nodes are named by
// draft_path (increasing, tokens matching); anything else is refused and
// changes nothing; the kept KV is the decode token plus the path.
TEST(SchedulerTest, TreeDraftPathsAreValidated) {
  auto s = Scheduler::Create(BaseOptions());
  ASSERT_TRUE(s.ok());
  Scheduler& sched = **s;
  ASSERT_TRUE(sched.AddSequence(1, {5, 6, 7, 8, 9}, Opts(20)).ok());
  auto b = sched.Schedule();
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(sched.OnStepDone({{1, {30}, {}}}).ok());
  DraftTokens drafts;
  drafts[1] = {10, 11, 12, 13};  // a tree's nodes (parents are the engine's)
  b = sched.Schedule(&drafts);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->sequences[0].num_draft_tokens, 4);
  for (const SampledTokens& bad : {SampledTokens{1, {13, 11, 50}, {3, 1}},  // not increasing
                                   SampledTokens{1, {11, 12, 50}, {1, 3}},  // token mismatch
                                   SampledTokens{1, {11, 50}, {1, 3}},      // path too long
                                   SampledTokens{1, {11, 13, 50}, {1, 4}},  // outside the draft
                                   SampledTokens{1, {11, 50}, {0}}}) {      // node 0 is 10
    absl::StatusOr<std::vector<SequenceOutput>> r = sched.OnStepDone({bad});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("sequence 1"));
  }
  auto done = sched.OnStepDone({{1, {11, 13, 50}, {1, 3}}});
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->size(), 1u);
  EXPECT_THAT((*done)[0].new_token_ids, ElementsAreArray({11, 13, 50}));
  const Sequence* seq = sched.FindSequence(1);
  EXPECT_THAT(seq->token_ids(), ElementsAreArray({5, 6, 7, 8, 9, 30, 11, 13, 50}));
  EXPECT_EQ(seq->num_computed_tokens(), 8);  // the decode token and the two accepted nodes
  EXPECT_EQ(sched.block_manager().NumSlots(1), 8);
  EXPECT_TRUE(sched.CheckInvariants().ok());
  // A path on a step without drafts is refused.
  b = sched.Schedule();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(sched.OnStepDone({{1, {7}, {0}}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(sched.OnStepDone({{1, {7}, {}}}).ok());
}

TEST(SchedulerTest, SingleRequestMatchesTheReference) {
  Harness h(BaseOptions());
  const auto prompt = RandomTokens(37, 2);
  const SamplingOptions opts = Opts(20);
  ASSERT_TRUE(h.Add(1, prompt, opts).ok());
  h.RunUntilIdle();
  EXPECT_THAT(h.generated(1), ElementsAreArray(h.Reference(prompt, opts)));
  EXPECT_EQ(h.generated(1).size(), 20u);
  const SequenceOutput& out = h.final_output(1);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out.num_prompt_tokens, 37);
  EXPECT_EQ(out.num_output_tokens, 20);
  EXPECT_EQ(h.scheduler().block_manager().num_used_blocks(), 0);
}

TEST(SchedulerTest, ChunkedPrefillSplitsALongPrompt) {
  SchedulerOptions o = BaseOptions();
  o.max_num_batched_tokens = 32;
  Harness h(o);
  const auto prompt = RandomTokens(100, 3);
  ASSERT_TRUE(h.Add(1, prompt, Opts(3)).ok());
  std::vector<int> chunks;
  int expected_start = 0;
  for (int i = 0; i < 4; ++i) {
    ScheduledBatch b = h.Step();
    ASSERT_EQ(b.sequences.size(), 1u);
    const ScheduledSequence& s = b.sequences[0];
    EXPECT_TRUE(s.is_prefill);
    EXPECT_EQ(s.start_position, expected_start);
    EXPECT_THAT(s.token_ids, ElementsAreArray(prompt.begin() + s.start_position,
                                              prompt.begin() + s.context_len()));
    // Logits only once the chunk reaches the prompt's end.
    EXPECT_EQ(s.needs_logits, s.context_len() == 100);
    EXPECT_GE(static_cast<int>(s.block_table.size()) * 16, s.context_len());
    chunks.push_back(s.num_tokens);
    expected_start += s.num_tokens;
  }
  EXPECT_EQ(chunks, (std::vector<int>{32, 32, 32, 4}));
  EXPECT_EQ(h.generated(1).size(), 1u);
  h.RunUntilIdle();
  EXPECT_THAT(h.generated(1), ElementsAreArray(h.Reference(prompt, Opts(3))));
}

TEST(SchedulerTest, TokenBudgetAndSequenceLimitHoldEveryStep) {
  SchedulerOptions o = BaseOptions();
  o.max_num_batched_tokens = 48;
  o.max_num_seqs = 5;
  Harness h(o);
  std::mt19937 rng(4);
  std::map<SequenceId, std::vector<TokenId>> prompts;
  for (SequenceId id = 1; id <= 30; ++id) {
    prompts[id] = RandomTokens(1 + rng() % 120, id);
    ASSERT_TRUE(h.Add(id, prompts[id], Opts(1 + rng() % 30)).ok());
  }
  int steps = 0;
  while (h.scheduler().HasUnfinished()) {
    ScheduledBatch b = h.Step();
    ASSERT_FALSE(b.empty());
    int sum = 0;
    for (const auto& s : b.sequences) sum += s.num_tokens;
    EXPECT_EQ(sum, b.num_batched_tokens);
    EXPECT_LE(b.num_batched_tokens, 48);
    EXPECT_LE(static_cast<int>(b.sequences.size()), 5);
    EXPECT_LE(h.scheduler().num_running(), 5);
    ASSERT_LT(++steps, 10000);
  }
  for (const auto& [id, prompt] : prompts) {
    const SequenceOutput& out = h.final_output(id);
    SamplingOptions opts = Opts(out.num_output_tokens);
    EXPECT_THAT(h.generated(id), ElementsAreArray(h.Reference(prompt, opts))) << id;
  }
}

TEST(SchedulerTest, DecodesComeBeforePrefills) {
  SchedulerOptions o = BaseOptions();
  o.max_num_batched_tokens = 8;
  Harness h(o);
  ASSERT_TRUE(h.Add(1, RandomTokens(5, 5), Opts(50)).ok());
  h.Step();  // prefill of seq 1; it now decodes
  ASSERT_TRUE(h.Add(2, RandomTokens(40, 6), Opts(5)).ok());
  for (int i = 0; i < 5; ++i) {
    ScheduledBatch b = h.Step();
    ASSERT_EQ(b.sequences.size(), 2u);
    EXPECT_EQ(b.sequences[0].id, 1u);
    EXPECT_FALSE(b.sequences[0].is_prefill);
    EXPECT_EQ(b.sequences[0].num_tokens, 1);
    EXPECT_TRUE(b.sequences[0].needs_logits);
    EXPECT_EQ(b.sequences[1].id, 2u);
    EXPECT_TRUE(b.sequences[1].is_prefill);
    EXPECT_EQ(b.sequences[1].num_tokens, 7);  // what the decode left
    EXPECT_EQ(b.num_decodes, 1);
    EXPECT_EQ(b.num_prefills, 1);
  }
  ScheduledBatch b = h.Step();  // the rest of the prompt (5 tokens)
  ASSERT_EQ(b.sequences.size(), 2u);
  EXPECT_EQ(b.sequences[1].num_tokens, 5);
  EXPECT_TRUE(b.sequences[1].needs_logits);
  b = h.Step();  // both decode now
  EXPECT_EQ(b.num_decodes, 2);
}

TEST(SchedulerTest, HigherPriorityFirstFifoWithinAPriority) {
  SchedulerOptions o = BaseOptions();
  o.max_num_seqs = 1;
  Harness h(o);
  const std::vector<std::pair<SequenceId, int>> requests = {{1, 0}, {2, 5}, {3, 2},
                                                            {4, 5}, {5, 0}, {6, 2}};
  for (auto [id, prio] : requests) ASSERT_TRUE(h.Add(id, RandomTokens(10, id), Opts(3, prio)).ok());
  std::vector<SequenceId> order;
  for (const ScheduledBatch& b : h.RunUntilIdle()) {
    for (const auto& s : b.sequences) {
      if (std::find(order.begin(), order.end(), s.id) == order.end()) order.push_back(s.id);
    }
  }
  EXPECT_EQ(order, (std::vector<SequenceId>{2, 4, 3, 6, 1, 5}));
}

// Two requests that cannot both hold their KV: the later one is preempted,
// recomputed, and still produces what it produces alone.
TEST(SchedulerTest, PreemptionByRecomputeKeepsOutputs) {
  for (bool prefix_caching : {true, false}) {
    SCOPED_TRACE(prefix_caching ? "prefix caching" : "no prefix caching");
    SchedulerOptions o = BaseOptions();
    o.block_size = 4;
    o.num_blocks = 12;  // 48 tokens of KV
    o.enable_prefix_caching = prefix_caching;
    o.watermark = 0;
    Harness h(o);
    SamplingOptions opts = Opts(30);
    const auto a = RandomTokens(10, 7), b = RandomTokens(10, 8);  // up to 39 tokens each
    ASSERT_TRUE(h.Add(1, a, opts).ok());
    ASSERT_TRUE(h.Add(2, b, opts).ok());
    std::vector<SequenceId> preempted;
    for (const ScheduledBatch& batch : h.RunUntilIdle()) {
      preempted.insert(preempted.end(), batch.preempted.begin(), batch.preempted.end());
    }
    ASSERT_FALSE(preempted.empty());
    for (SequenceId id : preempted) EXPECT_EQ(id, 2u);  // the later arrival
    EXPECT_EQ(h.final_output(1).num_preemptions, 0);
    EXPECT_GT(h.final_output(2).num_preemptions, 0);
    EXPECT_EQ(h.scheduler().stats().num_preemptions, static_cast<int64_t>(preempted.size()));
    EXPECT_THAT(h.generated(1), ElementsAreArray(h.Reference(a, opts)));
    EXPECT_THAT(h.generated(2), ElementsAreArray(h.Reference(b, opts)));
  }
}

TEST(SchedulerTest, PreemptionSparesTheHigherPriority) {
  SchedulerOptions o = BaseOptions();
  o.block_size = 4;
  o.num_blocks = 12;
  o.watermark = 0;
  Harness h(o);
  const auto a = RandomTokens(10, 9), b = RandomTokens(10, 10);
  ASSERT_TRUE(h.Add(1, a, Opts(30, 0)).ok());
  ASSERT_TRUE(h.Add(2, b, Opts(30, 1)).ok());  // arrives later, outranks
  h.RunUntilIdle();
  EXPECT_EQ(h.final_output(2).num_preemptions, 0);
  EXPECT_GT(h.final_output(1).num_preemptions, 0);
  EXPECT_THAT(h.generated(1), ElementsAreArray(h.Reference(a, Opts(30))));
  EXPECT_THAT(h.generated(2), ElementsAreArray(h.Reference(b, Opts(30))));
}

// A high-priority prefill never yields its blocks to lower-priority decodes:
// when the decodes scheduled ahead of it (decode first) took the last
// blocks, it waits, and the decodes preempt among themselves.
TEST(SchedulerTest, HigherPriorityPrefillIsNeverPreemptedForLowerDecodes) {
  SchedulerOptions o = BaseOptions();
  o.block_size = 4;
  o.num_blocks = 10;
  o.max_num_batched_tokens = 6;
  o.watermark = 0;
  Harness h(o);
  const auto d1 = RandomTokens(4, 30), d2 = RandomTokens(4, 31), a = RandomTokens(30, 32);
  ASSERT_TRUE(h.Add(1, d1, Opts(14, 0)).ok());
  ASSERT_TRUE(h.Add(2, d2, Opts(14, 0)).ok());
  h.Step();
  h.Step();
  ASSERT_EQ(h.scheduler().FindSequence(2)->num_uncomputed_tokens(), 1);  // decoding
  ASSERT_TRUE(h.Add(3, a, Opts(2, 5)).ok());
  std::vector<SequenceId> preempted;
  for (const ScheduledBatch& b : h.RunUntilIdle()) {
    preempted.insert(preempted.end(), b.preempted.begin(), b.preempted.end());
  }
  EXPECT_FALSE(preempted.empty());
  for (SequenceId id : preempted) EXPECT_NE(id, 3u);
  EXPECT_EQ(h.final_output(3).num_preemptions, 0);
  EXPECT_THAT(h.generated(1), ElementsAreArray(h.Reference(d1, Opts(14))));
  EXPECT_THAT(h.generated(2), ElementsAreArray(h.Reference(d2, Opts(14))));
  EXPECT_THAT(h.generated(3), ElementsAreArray(h.Reference(a, Opts(2))));
}

TEST(SchedulerTest, SharedPrefixComputesOnlyTheSuffix) {
  SchedulerOptions o = BaseOptions();
  o.max_num_batched_tokens = 2048;
  Harness h(o);
  const auto prefix = RandomTokens(512, 11);
  const auto pa = Concat(prefix, RandomTokens(21, 12));
  const auto pb = Concat(prefix, RandomTokens(30, 13));
  ASSERT_TRUE(h.Add(1, pa, Opts(4)).ok());
  h.RunUntilIdle();
  EXPECT_EQ(h.final_output(1).num_cached_tokens, 0);

  const int64_t prefill_before = h.scheduler().stats().num_prefill_tokens;
  ASSERT_TRUE(h.Add(2, pb, Opts(4)).ok());
  ScheduledBatch first = h.Step();
  ASSERT_EQ(first.sequences.size(), 1u);
  EXPECT_EQ(first.sequences[0].start_position, 512);
  EXPECT_EQ(first.sequences[0].num_tokens, 30);
  h.RunUntilIdle();
  EXPECT_EQ(h.scheduler().stats().num_prefill_tokens - prefill_before, 30);
  EXPECT_EQ(h.final_output(2).num_cached_tokens, 512);
  EXPECT_EQ(h.scheduler().stats().blocks.prefix_hit_tokens, 512);
  EXPECT_THAT(h.generated(2), ElementsAreArray(h.Reference(pb, Opts(4))));
}

TEST(SchedulerTest, FullyCachedPromptStillComputesItsLastBlock) {
  Harness h(BaseOptions());
  const auto prompt = RandomTokens(48, 14);  // 3 full blocks
  ASSERT_TRUE(h.Add(1, prompt, Opts(2)).ok());
  h.RunUntilIdle();
  ASSERT_TRUE(h.Add(2, prompt, Opts(2)).ok());
  ScheduledBatch b = h.Step();
  ASSERT_EQ(b.sequences.size(), 1u);
  EXPECT_EQ(b.sequences[0].start_position, 32);
  EXPECT_EQ(b.sequences[0].num_tokens, 16);
  EXPECT_TRUE(b.sequences[0].needs_logits);
  h.RunUntilIdle();
  EXPECT_EQ(h.final_output(2).num_cached_tokens, 32);
  EXPECT_EQ(h.generated(2), h.generated(1));
}

TEST(SchedulerTest, AbortFreesBlocksAtOnce) {
  SchedulerOptions o = BaseOptions();
  o.max_num_batched_tokens = 32;
  o.enable_prefix_caching = false;  // so freed blocks are plainly free
  Harness h(o);
  ASSERT_TRUE(h.Add(1, RandomTokens(100, 15), Opts(10)).ok());  // will be mid-prefill
  ASSERT_TRUE(h.Add(2, RandomTokens(300, 16), Opts(10)).ok());  // will be waiting
  h.Step();
  const Sequence* s1 = h.scheduler().FindSequence(1);
  ASSERT_NE(s1, nullptr);
  EXPECT_EQ(s1->status(), SequenceStatus::kRunning);
  EXPECT_EQ(s1->num_computed_tokens(), 32);
  EXPECT_EQ(h.scheduler().block_manager().num_used_blocks(), 2);
  ASSERT_TRUE(h.scheduler().Abort(1).ok());
  EXPECT_EQ(h.scheduler().block_manager().num_used_blocks(), 0);
  EXPECT_EQ(h.scheduler().FindSequence(1), nullptr);
  EXPECT_EQ(h.scheduler().Abort(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h.scheduler().Abort(99).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok());

  // Run seq 2 into its decode phase, then abort it.
  while (h.scheduler().FindSequence(2)->num_output_tokens() < 3) h.Step();
  EXPECT_GT(h.scheduler().block_manager().num_used_blocks(), 0);
  ASSERT_TRUE(h.scheduler().Abort(2).ok());
  EXPECT_EQ(h.scheduler().block_manager().num_used_blocks(), 0);
  EXPECT_FALSE(h.scheduler().HasUnfinished());
  EXPECT_EQ(h.scheduler().stats().num_aborted, 2);

  // A waiting request is dropped from the queue.
  ASSERT_TRUE(h.Add(3, RandomTokens(10, 17), Opts(10)).ok());
  ASSERT_TRUE(h.scheduler().Abort(3).ok());
  EXPECT_EQ(h.scheduler().num_waiting(), 0);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok());
}

TEST(SchedulerTest, AbortDuringAStepCompletesWithTheStep) {
  Harness h(BaseOptions());
  FakeModel model(256, 16, kVocab);
  ASSERT_TRUE(h.Add(1, RandomTokens(20, 18), Opts(10)).ok());
  ASSERT_TRUE(h.Add(2, RandomTokens(20, 19), Opts(10)).ok());
  auto batch = h.scheduler().Schedule();
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->sequences.size(), 2u);
  auto sampled = model.Run(*batch);
  ASSERT_TRUE(sampled.ok());
  const int used = h.scheduler().block_manager().num_used_blocks();
  ASSERT_TRUE(h.scheduler().Abort(1).ok());
  // The step may still be writing seq 1's KV: its blocks are held.
  EXPECT_EQ(h.scheduler().block_manager().num_used_blocks(), used);
  EXPECT_EQ(h.scheduler().FindSequence(1), nullptr);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok()) << h.scheduler().CheckInvariants();
  auto outputs = h.scheduler().OnStepDone(*sampled);  // includes seq 1's token: ignored
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->size(), 1u);
  EXPECT_EQ((*outputs)[0].id, 2u);
  EXPECT_EQ(h.scheduler().block_manager().num_used_blocks(), 2);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok()) << h.scheduler().CheckInvariants();
}

// A failed step: its sequences (one aborted during it) are aborted and
// freed, one not in the step keeps waiting, and the scheduler takes the
// next step.
TEST(SchedulerTest, FailedStepAbortsAndFreesItsSequences) {
  SchedulerOptions o = BaseOptions();
  o.max_num_seqs = 2;
  Harness h(o);
  FakeModel model(256, 16, kVocab);
  EXPECT_EQ(h.scheduler().OnStepFailed().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(h.Add(1, RandomTokens(20, 30), Opts(10)).ok());
  ASSERT_TRUE(h.Add(2, RandomTokens(20, 31), Opts(10)).ok());
  ASSERT_TRUE(h.Add(3, RandomTokens(20, 32), Opts(10)).ok());  // beyond max_num_seqs: waits
  auto batch = h.scheduler().Schedule();
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->sequences.size(), 2u);
  ASSERT_TRUE(h.scheduler().Abort(2).ok());
  auto ended = h.scheduler().OnStepFailed();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_THAT(*ended, ElementsAreArray({SequenceId{1}}));
  EXPECT_FALSE(h.scheduler().step_in_flight());
  EXPECT_EQ(h.scheduler().FindSequence(1), nullptr);
  EXPECT_EQ(h.scheduler().FindSequence(2), nullptr);
  ASSERT_NE(h.scheduler().FindSequence(3), nullptr);
  EXPECT_EQ(h.scheduler().block_manager().num_used_blocks(), 0);
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok()) << h.scheduler().CheckInvariants();
  auto next = h.scheduler().Schedule();
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->sequences.size(), 1u);
  EXPECT_EQ(next->sequences[0].id, 3u);
  auto sampled = model.Run(*next);
  ASSERT_TRUE(sampled.ok());
  ASSERT_TRUE(h.scheduler().OnStepDone(*sampled).ok());
  EXPECT_TRUE(h.scheduler().CheckInvariants().ok()) << h.scheduler().CheckInvariants();
}

TEST(SchedulerTest, StepProtocolErrorsChangeNothing) {
  Harness h(BaseOptions());
  FakeModel model(256, 16, kVocab);
  EXPECT_EQ(h.scheduler().OnStepDone({}).status().code(), absl::StatusCode::kFailedPrecondition);
  auto empty = h.scheduler().Schedule();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(h.scheduler().step_in_flight());

  ASSERT_TRUE(h.Add(1, RandomTokens(20, 20), Opts(10)).ok());
  ASSERT_TRUE(h.Add(2, RandomTokens(20, 21), Opts(10)).ok());
  auto batch = h.scheduler().Schedule();
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(h.scheduler().Schedule().status().code(), absl::StatusCode::kFailedPrecondition);
  auto sampled = model.Run(*batch);
  ASSERT_TRUE(sampled.ok());
  ASSERT_EQ(sampled->size(), 2u);

  auto expect_invalid = [&](std::vector<SampledTokens> s, const char* why) {
    auto r = h.scheduler().OnStepDone(s);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_TRUE(h.scheduler().step_in_flight()) << why;
  };
  expect_invalid({(*sampled)[0]}, "missing one");
  expect_invalid({(*sampled)[0], (*sampled)[1], (*sampled)[1]}, "duplicate");
  expect_invalid({(*sampled)[0], (*sampled)[1], {7, {1}}}, "unknown id");
  expect_invalid({(*sampled)[0], {(*sampled)[1].id, {}}}, "no token");
  expect_invalid({(*sampled)[0], {(*sampled)[1].id, {kVocab}}}, "out of vocabulary");
  EXPECT_EQ(h.scheduler().FindSequence(1)->num_computed_tokens(), 0);

  auto outputs = h.scheduler().OnStepDone(*sampled);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ(outputs->size(), 2u);
  EXPECT_EQ(h.scheduler().FindSequence(1)->num_computed_tokens(), 20);
}

// Stop conditions, checked against the unstopped stream of the fake model.
TEST(SchedulerTest, StopConditions) {
  std::vector<TokenId> prompt = RandomTokens(12, 22);
  for (TokenId& t : prompt) t %= 20;
  SchedulerOptions o = BaseOptions();
  o.vocab_size = 20;  // small: tokens repeat
  Harness h(o);
  const std::vector<TokenId> stream = h.Reference(prompt, Opts(40));
  ASSERT_EQ(stream.size(), 40u);
  const TokenId target = stream[5];
  const size_t first = std::find(stream.begin(), stream.end(), target) - stream.begin();
  const std::vector<TokenId> until_target(stream.begin(), stream.begin() + first + 1);

  SamplingOptions eos = Opts(40);
  eos.eos_token_ids = {target};
  SamplingOptions eos_ignored = eos;
  eos_ignored.ignore_eos = true;
  SamplingOptions stop = Opts(40);
  stop.stop_token_ids = {target};
  SamplingOptions short_len = Opts(3);
  ASSERT_TRUE(h.Add(1, prompt, eos).ok());
  ASSERT_TRUE(h.Add(2, prompt, eos_ignored).ok());
  ASSERT_TRUE(h.Add(3, prompt, stop).ok());
  ASSERT_TRUE(h.Add(4, prompt, short_len).ok());
  h.RunUntilIdle();
  EXPECT_THAT(h.generated(1), ElementsAreArray(until_target));
  EXPECT_EQ(h.final_output(1).finish_reason, FinishReason::kStop);
  EXPECT_THAT(h.generated(2), ElementsAreArray(stream));
  EXPECT_EQ(h.final_output(2).finish_reason, FinishReason::kLength);
  EXPECT_THAT(h.generated(3), ElementsAreArray(until_target));
  EXPECT_EQ(h.final_output(3).finish_reason, FinishReason::kStop);
  EXPECT_THAT(h.generated(4), ElementsAreArray(stream.begin(), stream.begin() + 3));
  EXPECT_EQ(h.final_output(4).finish_reason, FinishReason::kLength);
}

TEST(SchedulerTest, ResumedRequestContinuesWhereItLeftOff) {
  Harness h(BaseOptions());
  const auto prompt = RandomTokens(30, 23);
  const std::vector<TokenId> full = h.Reference(prompt, Opts(12));
  const std::vector<TokenId> given(full.begin(), full.begin() + 5);
  ASSERT_TRUE(h.Add(1, prompt, Opts(12), given).ok());
  ScheduledBatch b = h.Step();
  ASSERT_EQ(b.sequences.size(), 1u);
  EXPECT_EQ(b.sequences[0].num_tokens, 35);  // prompt and given output recomputed
  h.RunUntilIdle();
  EXPECT_THAT(h.generated(1), ElementsAreArray(full.begin() + 5, full.end()));
  EXPECT_EQ(h.final_output(1).num_output_tokens, 12);
}

TEST(SchedulerTest, SeveralSampledTokensAreAppendedUntilAStop) {
  Harness h(BaseOptions());
  SamplingOptions opts = Opts(10);
  opts.stop_token_ids = {99};
  ASSERT_TRUE(h.Add(1, RandomTokens(6, 24), opts).ok());
  auto batch = h.scheduler().Schedule();
  ASSERT_TRUE(batch.ok());
  auto out = h.scheduler().OnStepDone({{1, {5, 6, 7}}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT((*out)[0].new_token_ids, ElementsAreArray({5, 6, 7}));
  // The next step computes the three new tokens at once.
  batch = h.scheduler().Schedule();
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->sequences.size(), 1u);
  EXPECT_EQ(batch->sequences[0].start_position, 6);
  EXPECT_THAT(batch->sequences[0].token_ids, ElementsAreArray({5, 6, 7}));
  EXPECT_TRUE(batch->sequences[0].needs_logits);
  out = h.scheduler().OnStepDone({{1, {8, 99, 9}}});
  ASSERT_TRUE(out.ok());
  EXPECT_THAT((*out)[0].new_token_ids, ElementsAreArray({8, 99}));
  EXPECT_TRUE((*out)[0].finished);
  EXPECT_EQ((*out)[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ((*out)[0].num_output_tokens, 5);
}

TEST(SchedulerTest, TimesAreRecorded) {
  SchedulerOptions o = BaseOptions();
  o.max_num_seqs = 1;
  Harness h(o);
  ASSERT_TRUE(h.Add(1, RandomTokens(10, 25), Opts(3)).ok());
  ASSERT_TRUE(h.Add(2, RandomTokens(10, 26), Opts(3)).ok());
  h.RunUntilIdle();  // every step advances the clock by 10 ms
  const SequenceTimes& t1 = h.final_output(1).times;
  const SequenceTimes& t2 = h.final_output(2).times;
  EXPECT_EQ(t1.arrival, kT0);
  ASSERT_TRUE(t1.first_scheduled && t1.first_token && t1.finished);
  EXPECT_EQ(*t1.first_scheduled, kT0);
  EXPECT_EQ(*t1.first_token, kT0);  // sampled at the end of step 1 (same clock)
  EXPECT_EQ(*t1.finished, kT0 + absl::Milliseconds(20));
  ASSERT_TRUE(t2.first_scheduled.has_value());
  EXPECT_EQ(*t2.first_scheduled, kT0 + absl::Milliseconds(30));  // queued behind seq 1
}

TEST(SchedulerTest, KvEventsCarryTheChainedHashesOfComputedBlocks) {
  Harness h(BaseOptions());
  const auto prompt = RandomTokens(40, 27);
  ASSERT_TRUE(h.Add(1, prompt, Opts(10)).ok());
  h.RunUntilIdle();
  // 50 tokens, 49 computed: 3 full blocks.
  const auto all = Concat(prompt, h.generated(1));
  std::vector<uint64_t> expected;
  HashFullBlocks(absl::MakeConstSpan(all).first(48), 16, 0, &expected);
  std::vector<uint64_t> stored;
  for (const KvCacheEvent& e : h.scheduler().TakeKvEvents()) {
    ASSERT_EQ(e.kind, KvCacheEvent::Kind::kStored);
    stored.insert(stored.end(), e.block_hashes.begin(), e.block_hashes.end());
  }
  EXPECT_THAT(stored, ElementsAreArray(expected));
  EXPECT_EQ(h.scheduler().block_manager().num_cached_blocks(), 3);
  EXPECT_EQ(h.scheduler().ResetPrefixCache(), 3);
  std::vector<uint64_t> removed;
  for (const KvCacheEvent& e : h.scheduler().TakeKvEvents()) {
    ASSERT_EQ(e.kind, KvCacheEvent::Kind::kRemoved);
    removed.insert(removed.end(), e.block_hashes.begin(), e.block_hashes.end());
  }
  EXPECT_THAT(removed, ::testing::UnorderedElementsAreArray(expected));
}

// ---- Pending tokens (the engine's pipelined steps) ----

// Completes the step in flight with a pending token for every sequence
// that samples.
std::vector<SequenceOutput> CompletePending(Scheduler& s, const ScheduledBatch& batch) {
  std::vector<SampledTokens> pending;
  for (const ScheduledSequence& q : batch.sequences) {
    if (q.needs_logits) pending.push_back({q.id, {kPendingToken}, {}});
  }
  absl::StatusOr<std::vector<SequenceOutput>> out = s.OnStepDone(pending);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<SequenceOutput>{};
}

TEST(SchedulerTest, APendingTokenIsDecodedAndResolvedBeforeItsStepCompletes) {
  auto s = *Scheduler::Create(BaseOptions());
  const auto prompt = RandomTokens(20, 41);
  ASSERT_TRUE(s->AddSequence(1, prompt, Opts(10)).ok());
  ScheduledBatch prefill = *s->Schedule();
  const auto out = CompletePending(*s, prefill);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(out[0].new_token_ids, ElementsAreArray({kPendingToken}));
  EXPECT_FALSE(out[0].finished);
  // The next step decodes the placeholder; its id arrives meanwhile.
  ScheduledBatch decode = *s->Schedule();
  ASSERT_EQ(decode.sequences.size(), 1u);
  EXPECT_THAT(decode.sequences[0].token_ids, ElementsAreArray({kPendingToken}));
  absl::StatusOr<std::optional<SequenceOutput>> resolved = s->ResolvePendingToken(1, 7);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_FALSE(resolved->has_value());
  EXPECT_EQ(s->FindSequence(1)->token_ids().back(), 7);
  ASSERT_TRUE(s->OnStepDone({{1, {8}, {}}}).ok());
  EXPECT_THAT(s->FindSequence(1)->output_token_ids(), ElementsAreArray({7, 8}));
  EXPECT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
  // Nothing pending any more: nothing to resolve.
  resolved = s->ResolvePendingToken(1, 9);
  ASSERT_TRUE(resolved.ok());
  EXPECT_FALSE(resolved->has_value());
  EXPECT_EQ(s->FindSequence(1)->token_ids().back(), 8);
}

TEST(SchedulerTest, AStopIdResolvedDuringTheNextStepFinishesTheSequence) {
  auto s = *Scheduler::Create(BaseOptions());
  SamplingOptions o = Opts(10);
  o.stop_token_ids = {5};
  ASSERT_TRUE(s->AddSequence(1, RandomTokens(20, 42), o).ok());
  CompletePending(*s, *s->Schedule());
  ScheduledBatch next = *s->Schedule();  // has the sequence, with its placeholder
  absl::StatusOr<std::optional<SequenceOutput>> resolved = s->ResolvePendingToken(1, 5);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ASSERT_TRUE(resolved->has_value());
  EXPECT_TRUE((*resolved)->finished);
  EXPECT_EQ((*resolved)->finish_reason, FinishReason::kStop);
  EXPECT_THAT((*resolved)->new_token_ids, ElementsAreArray({5}));
  EXPECT_EQ((*resolved)->num_output_tokens, 1);
  EXPECT_EQ(s->FindSequence(1), nullptr);
  // Its blocks are written by the step in flight: freed when it completes,
  // which reports nothing for it.
  EXPECT_GT(s->block_manager().stats().num_used_blocks, 0);
  absl::StatusOr<std::vector<SequenceOutput>> done = s->OnStepDone({});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->empty());
  EXPECT_EQ(s->block_manager().stats().num_used_blocks, 0);
  EXPECT_FALSE(s->HasUnfinished());
  EXPECT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
}

TEST(SchedulerTest, ALengthLimitOnAPendingTokenFinishesAtOnceAndReportsTheIdLater) {
  auto s = *Scheduler::Create(BaseOptions());
  SamplingOptions o = Opts(1);
  o.stop_token_ids = {5};
  ASSERT_TRUE(s->AddSequence(1, RandomTokens(20, 43), o).ok());
  ASSERT_TRUE(s->AddSequence(2, RandomTokens(20, 44), o).ok());
  const auto out = CompletePending(*s, *s->Schedule());
  ASSERT_EQ(out.size(), 2u);
  for (const SequenceOutput& x : out) {
    EXPECT_TRUE(x.finished);
    EXPECT_EQ(x.finish_reason, FinishReason::kLength);
  }
  EXPECT_TRUE(s->Schedule()->empty()) << "finished: not scheduled again";
  // The id decides the reason, as a plain step would: a stop id stops.
  auto one = s->ResolvePendingToken(1, 5);
  auto two = s->ResolvePendingToken(2, 6);
  ASSERT_TRUE(one.ok() && two.ok());
  ASSERT_TRUE(one->has_value() && two->has_value());
  EXPECT_EQ((*one)->finish_reason, FinishReason::kStop);
  EXPECT_EQ((*two)->finish_reason, FinishReason::kLength);
  EXPECT_THAT((*two)->new_token_ids, ElementsAreArray({6}));
  EXPECT_EQ((*two)->num_output_tokens, 1);
  // Once only.
  auto again = s->ResolvePendingToken(2, 6);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
}

TEST(SchedulerTest, PendingTokensAreCheckedAndAbortsForgetThem) {
  auto s = *Scheduler::Create(BaseOptions());
  ASSERT_TRUE(s->AddSequence(1, RandomTokens(20, 45), Opts(1)).ok());
  ASSERT_TRUE(s->AddSequence(2, RandomTokens(20, 46), Opts(8)).ok());
  CompletePending(*s, *s->Schedule());
  EXPECT_EQ(s->ResolvePendingToken(2, kVocab).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->ResolvePendingToken(2, -1).status().code(), absl::StatusCode::kInvalidArgument);
  // Aborted with its token pending (finished by length, or running).
  s->Abort(1).IgnoreError();
  ASSERT_TRUE(s->Abort(2).ok());
  for (SequenceId id : {1, 2}) {
    auto r = s->ResolvePendingToken(id, 3);
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->has_value()) << id;
  }
  EXPECT_EQ(s->block_manager().stats().num_used_blocks, 0);
  EXPECT_TRUE(s->CheckInvariants().ok()) << s->CheckInvariants();
}

}  // namespace
}  // namespace tessera::engine
