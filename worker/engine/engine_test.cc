// The engine loop with the CPU runner on a small random model: batch
// invariance (also across preemption), prefix caching, cancellation and
// backpressure; a runner that breaks for good.
#include "worker/engine/engine.h"

#include <cstdlib>
#include <map>
#include <random>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"

namespace tessera::engine {
namespace {

using ::testing::HasSubstr;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = "/tmp/tessera-engine-XXXXXX";
    dir_ = new std::string(mkdtemp(pattern.data()));
    runner::TestModelSpec spec;
    spec.vocab = 512;
    spec.hidden = 128;
    spec.intermediate = 256;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.head_dim = 32;
    spec.dtype = model::DType::kBF16;
    ASSERT_TRUE(runner::WriteTestModel(*dir_, spec).ok());
    auto m = model::LoadModel(*dir_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }

  std::unique_ptr<Engine> MakeEngine(int num_blocks, int max_batched_tokens = 256,
                                     int max_waiting = 1024) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 16;
    ro.num_kv_blocks = num_blocks;
    auto r = runner::CpuModelRunner::Create(model_, ro);
    EXPECT_TRUE(r.ok()) << r.status();
    EngineOptions eo;
    eo.scheduler.max_num_batched_tokens = max_batched_tokens;
    eo.scheduler.max_num_seqs = 64;
    eo.scheduler.max_model_len = 2048;
    eo.scheduler.watermark = 0;
    eo.max_waiting = max_waiting;
    eo.eos_token_ids = {2};
    auto e = Engine::Create(std::move(*r), eo);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }

  static EngineRequest Greedy(std::vector<TokenId> prompt, int max_tokens) {
    EngineRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  }

  static std::vector<TokenId> RandomPrompt(int n, int seed) {
    std::mt19937 rng(seed);
    std::vector<TokenId> p(n);
    for (auto& t : p) t = static_cast<TokenId>(3 + rng() % 500);
    return p;
  }

  // Reads a stream to its end; returns the tokens and the final event.
  static std::vector<TokenId> Collect(RequestStream& s, StreamEvent* final_event) {
    std::vector<TokenId> tokens;
    StreamEvent e;
    while (true) {
      if (!s.Next(&e, absl::Seconds(120))) {
        ADD_FAILURE() << "stream timed out";
        return tokens;
      }
      for (const TokenReport& t : e.tokens) tokens.push_back(t.token);
      if (e.finished) break;
    }
    if (final_event) *final_event = e;
    return tokens;
  }

  static std::string* dir_;
  static model::LoadedModel* model_;
};

std::string* EngineTest::dir_ = nullptr;
model::LoadedModel* EngineTest::model_ = nullptr;

TEST_F(EngineTest, OutputsDoNotDependOnBatchingOrPreemption) {
  const int kRequests = 16;
  std::vector<EngineRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(Greedy(RandomPrompt(5 + (i * 37) % 120, i), 12 + (i * 7) % 20));
  }
  // Alone: one request at a time on a roomy cache.
  std::vector<std::vector<TokenId>> alone;
  {
    auto engine = MakeEngine(256);
    engine->Start();
    for (const EngineRequest& r : requests) {
      auto s = engine->Submit(r);
      ASSERT_TRUE(s.ok()) << s.status();
      alone.push_back(Collect(**s, nullptr));
    }
  }
  // Together, on a cache small enough to force preemptions.
  auto engine = MakeEngine(/*num_blocks=*/24, /*max_batched_tokens=*/64);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) {
    auto s = engine->Submit(r);
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  engine->Start();
  for (int i = 0; i < kRequests; ++i) {
    StreamEvent last;
    EXPECT_EQ(Collect(*streams[i], &last), alone[i]) << "request " << i;
    EXPECT_TRUE(last.error.ok()) << last.error;
    EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  }
  EXPECT_GT(engine->Load().preemptions, 0) << "the test meant to exercise preemption";
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);
}

TEST_F(EngineTest, SharedPrefixIsComputedOnce) {
  std::vector<TokenId> prefix = RandomPrompt(512, 99);
  std::vector<TokenId> a = prefix, b = prefix;
  for (TokenId t : RandomPrompt(20, 1)) a.push_back(t);
  for (TokenId t : RandomPrompt(23, 2)) b.push_back(t);

  std::vector<TokenId> uncached;
  {
    auto fresh = MakeEngine(128);
    fresh->Start();
    auto s = fresh->Submit(Greedy(b, 8));
    ASSERT_TRUE(s.ok());
    StreamEvent last;
    uncached = Collect(**s, &last);
    EXPECT_EQ(last.cached_tokens, 0);
  }
  auto engine = MakeEngine(128);
  engine->Start();
  auto first = engine->Submit(Greedy(a, 8));
  ASSERT_TRUE(first.ok());
  Collect(**first, nullptr);
  auto second = engine->Submit(Greedy(b, 8));
  ASSERT_TRUE(second.ok());
  StreamEvent last;
  EXPECT_EQ(Collect(**second, &last), uncached);
  // The 512 shared tokens are 32 full blocks of 16.
  EXPECT_EQ(last.cached_tokens, 512);
  EXPECT_GT(engine->Load().prefix_cache_hit_rate, 0);
  bool gap = false;
  uint64_t next = 0;
  auto events = engine->EventsSince(0, &next, &gap);
  EXPECT_FALSE(events.empty());
  EXPECT_FALSE(gap);
  EXPECT_GE(engine->CachedBlocks().size(), 32u);
}

TEST_F(EngineTest, CancellationFreesBlocksAtOnce) {
  auto engine = MakeEngine(128);
  engine->Start();
  auto s = engine->Submit(Greedy(RandomPrompt(100, 5), 1000));
  ASSERT_TRUE(s.ok());
  StreamEvent e;
  ASSERT_TRUE((*s)->Next(&e, absl::Seconds(60)));  // it is running
  engine->Cancel((*s)->id());
  StreamEvent last;
  Collect(**s, &last);
  EXPECT_EQ(last.finish_reason, FinishReason::kAbort);
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (engine->Load().kv_blocks_used != 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);
  EXPECT_EQ(engine->Load().running, 0);
}

TEST_F(EngineTest, FullQueueAndBadRequestsAreRefused) {
  auto engine = MakeEngine(64, 256, /*max_waiting=*/2);  // not started: nothing drains
  ASSERT_TRUE(engine->Submit(Greedy(RandomPrompt(4, 1), 4)).ok());
  ASSERT_TRUE(engine->Submit(Greedy(RandomPrompt(4, 2), 4)).ok());
  auto full = engine->Submit(Greedy(RandomPrompt(4, 3), 4));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);

  auto empty = engine->Submit(Greedy({}, 4));
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("prompt must not be empty"));
  auto bad_id = engine->Submit(Greedy({1, 512}, 4));
  EXPECT_THAT(std::string(bad_id.status().message()), HasSubstr("prompt token 1 is 512"));
  auto zero = engine->Submit(Greedy({1, 2}, 0));
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("max_tokens must be >= 1"));
  auto huge = engine->Submit(Greedy({1, 2}, 1 << 20));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EngineRequest hot = Greedy({1, 2}, 4);
  hot.sampling.temperature = -1;
  EXPECT_THAT(std::string(engine->Submit(hot).status().message()), HasSubstr("temperature"));
}

// A runner whose step number `fail_step` (counting from 1) fails; with
// `permanent`, every later one too, and Health() says why (a
// tensor-parallel group whose ranks fell out of step).
class FailingRunner final : public runner::ModelRunner {
 public:
  FailingRunner(std::unique_ptr<runner::ModelRunner> inner, int fail_step, bool permanent)
      : inner_(std::move(inner)), fail_step_(fail_step), permanent_(permanent) {}
  const model::ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override {
    ++steps_;
    if (steps_ == fail_step_ || (permanent_ && steps_ > fail_step_)) {
      absl::Status failed = absl::FailedPreconditionError("group out of step");
      if (permanent_) broken_ = failed;
      return failed;
    }
    return inner_->Forward(batch, logits);
  }
  absl::Status Health() const override { return broken_; }
  int steps() const { return steps_; }

 private:
  std::unique_ptr<runner::ModelRunner> inner_;
  int fail_step_;
  bool permanent_;
  int steps_ = 0;
  absl::Status broken_;
};

class EngineFailureTest : public EngineTest {
 protected:
  // An engine over FailingRunner (host sampling), started, whose
  // OnRunnerFailed reports land in reports_ (read after Stop()).
  std::unique_ptr<Engine> MakeFailing(int fail_step, bool permanent, FailingRunner** runner,
                                      int max_num_seqs = 8, EngineObserver* observer = nullptr) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 16;
    ro.num_kv_blocks = 64;
    auto cpu = runner::CpuModelRunner::Create(model_, ro);
    EXPECT_TRUE(cpu.ok()) << cpu.status();
    auto failing = std::make_unique<FailingRunner>(std::move(*cpu), fail_step, permanent);
    *runner = failing.get();
    EngineOptions eo;
    eo.scheduler.max_num_batched_tokens = 256;
    eo.scheduler.max_num_seqs = max_num_seqs;
    eo.scheduler.max_model_len = 512;
    eo.scheduler.watermark = 0;
    eo.eos_token_ids = {2};
    eo.device_sampling = false;
    auto engine = Engine::Create(std::move(failing), eo, observer);
    EXPECT_TRUE(engine.ok()) << engine.status();
    (*engine)->OnRunnerFailed([this](const absl::Status& s) { reports_.push_back(s); });
    (*engine)->Start();
    return std::move(*engine);
  }
  std::vector<absl::Status> reports_;
};

// One failed step fails the request in it and frees its KV blocks; a
// request waiting outside the step, and one submitted afterwards, run as
// on a runner that never failed; nothing is reported.
TEST_F(EngineFailureTest, OneFailedStepFailsItsRequestsOnly) {
  const std::vector<TokenId> prompt_b = RandomPrompt(8, 5), prompt_c = RandomPrompt(9, 6);
  std::vector<TokenId> want_b, want_c;
  {
    auto healthy = MakeEngine(64);
    healthy->Start();
    auto b = healthy->Submit(Greedy(prompt_b, 6));
    auto c = healthy->Submit(Greedy(prompt_c, 5));
    ASSERT_TRUE(b.ok() && c.ok());
    want_b = Collect(**b, nullptr);
    want_c = Collect(**c, nullptr);
    ASSERT_EQ(want_b.size(), 6u);
    ASSERT_EQ(want_c.size(), 5u);
  }
  FailingRunner* runner = nullptr;
  // One sequence per step: b waits while a runs.
  auto engine = MakeFailing(/*fail_step=*/3, /*permanent=*/false, &runner, /*max_num_seqs=*/1);
  auto a = engine->Submit(Greedy(RandomPrompt(8, 4), 10));
  auto b = engine->Submit(Greedy(prompt_b, 6));
  ASSERT_TRUE(a.ok() && b.ok());
  StreamEvent end;
  EXPECT_EQ(Collect(**a, &end).size(), 2u);  // the prefill's token and one decode step's
  EXPECT_EQ(end.error.code(), absl::StatusCode::kFailedPrecondition) << end.error;
  EXPECT_EQ(Collect(**b, &end), want_b);
  EXPECT_TRUE(end.error.ok()) << end.error;
  auto c = engine->Submit(Greedy(prompt_c, 5));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Collect(**c, &end), want_c);
  EXPECT_TRUE(end.error.ok()) << end.error;
  engine->Stop();
  EXPECT_TRUE(reports_.empty());
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);  // the failed request's blocks were freed
}

// Counts the requests' last events by how they ended.
class EndingsObserver final : public EngineObserver {
 public:
  void OnFinished(const StreamEvent& e, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    ++counts_[!e.error.ok() ? "error" : std::string(FinishReasonName(e.finish_reason))];
  }
  std::map<std::string, int> counts() const {
    absl::MutexLock lock(&mu_);
    return counts_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int> counts_ ABSL_GUARDED_BY(mu_);
};

// Every request's end reaches the observer once: a finish, an abort (a
// cancel) and an error (a failed step) alike; the worker's
// tessera_worker_requests_finished_total counts from it.
TEST_F(EngineFailureTest, ObserverSeesEveryEndFinishedAbortedOrFailed) {
  EndingsObserver observer;
  FailingRunner* runner = nullptr;
  auto engine =
      MakeFailing(/*fail_step=*/3, /*permanent=*/false, &runner, /*max_num_seqs=*/1, &observer);
  auto failed = engine->Submit(Greedy(RandomPrompt(8, 4), 10));  // in the failing step
  ASSERT_TRUE(failed.ok());
  StreamEvent end;
  Collect(**failed, &end);
  EXPECT_FALSE(end.error.ok());
  auto finished = engine->Submit(Greedy(RandomPrompt(8, 5), 3));
  ASSERT_TRUE(finished.ok());
  Collect(**finished, &end);
  EXPECT_EQ(end.finish_reason, FinishReason::kLength);
  auto cancelled = engine->Submit(Greedy(RandomPrompt(8, 6), 400));
  ASSERT_TRUE(cancelled.ok());
  StreamEvent first;
  ASSERT_TRUE((*cancelled)->Next(&first, absl::Seconds(60)));
  engine->Cancel((*cancelled)->id());
  Collect(**cancelled, &end);
  EXPECT_EQ(end.finish_reason, FinishReason::kAbort);
  // Refused at admission in the engine loop: its context cannot hold it.
  auto too_long = engine->Submit(Greedy(RandomPrompt(600, 7), 1));
  if (too_long.ok()) {
    Collect(**too_long, &end);
    EXPECT_FALSE(end.error.ok());
  }
  engine->Stop();
  const std::map<std::string, int> want = {
      {"error", too_long.ok() ? 2 : 1}, {"length", 1}, {"abort", 1}};
  EXPECT_EQ(observer.counts(), want);
}

// A step that fails with the runner broken for good fails its requests
// with UNAVAILABLE naming the runner's reason (so that a router runs them
// elsewhere) and reports the breakage once (the worker then leaves
// service); later requests fail the same way, without another report.
TEST_F(EngineFailureTest, BrokenRunnerFailsRequestsAndIsReportedOnce) {
  FailingRunner* runner = nullptr;
  auto engine = MakeFailing(/*fail_step=*/4, /*permanent=*/true, &runner);
  auto first = engine->Submit(Greedy(RandomPrompt(8, 4), 10));
  ASSERT_TRUE(first.ok()) << first.status();
  StreamEvent end;
  EXPECT_EQ(Collect(**first, &end).size(), 3u);  // the prefill's token and two decode steps'
  EXPECT_EQ(end.error.code(), absl::StatusCode::kUnavailable) << end.error;
  EXPECT_THAT(std::string(end.error.message()),
              HasSubstr("model runner failed for good: group out of step"));

  auto second = engine->Submit(Greedy(RandomPrompt(8, 5), 4));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(Collect(**second, &end).empty());
  EXPECT_EQ(end.error.code(), absl::StatusCode::kUnavailable) << end.error;
  EXPECT_THAT(std::string(end.error.message()), HasSubstr("group out of step"));
  engine->Stop();
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_EQ(reports_[0].code(), absl::StatusCode::kFailedPrecondition);
  // The second request ran one failing step, unless it was still in the
  // engine's inbox when the first failure failed every request.
  EXPECT_GE(runner->steps(), 4);
  EXPECT_LE(runner->steps(), 5);
}

// A runner that "samples on the device" by the host argmax of the inner
// runner's logits, and on its step number `bad_step` returns the
// vocabulary size, an id outside it, as the first row's token.
class OutOfVocabSampler final : public runner::ModelRunner {
 public:
  OutOfVocabSampler(std::unique_ptr<runner::ModelRunner> inner, int bad_step)
      : inner_(std::move(inner)), bad_step_(bad_step) {}
  const model::ModelConfig& config() const override { return inner_->config(); }
  int block_size() const override { return inner_->block_size(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  absl::Status Forward(const runner::ForwardBatch& batch, std::vector<float>* logits) override {
    return inner_->Forward(batch, logits);
  }
  bool SupportsDeviceSampling() const override { return true; }
  absl::Status ForwardSample(const runner::ForwardBatch& batch,
                             absl::Span<const runner::DeviceSamplingRow> rows,
                             std::vector<int32_t>* tokens) override {
    std::vector<float> logits;
    if (absl::Status s = inner_->Forward(batch, &logits); !s.ok()) return s;
    const int64_t vocab = config().vocab_size;
    tokens->clear();
    for (size_t r = 0; r < rows.size(); ++r) {
      const float* row = logits.data() + r * vocab;
      tokens->push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    if (++steps_ == bad_step_) (*tokens)[0] = static_cast<int32_t>(vocab);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<runner::ModelRunner> inner_;
  int bad_step_;
  int steps_ = 0;
};

// A token id outside the vocabulary from the device sampler fails that
// row's request alone with INTERNAL; the other request of the step goes on
// to the tokens it gets on a sound runner, and no KV block is left behind.
TEST_F(EngineTest, DeviceTokenOutsideTheVocabularyFailsItsRequestOnly) {
  const std::vector<TokenId> prompts[2] = {RandomPrompt(8, 7), RandomPrompt(9, 8)};
  std::vector<TokenId> want[2];
  {
    auto healthy = MakeEngine(64);
    healthy->Start();
    for (int i = 0; i < 2; ++i) {
      auto s = healthy->Submit(Greedy(prompts[i], 6));
      ASSERT_TRUE(s.ok());
      want[i] = Collect(**s, nullptr);
      ASSERT_EQ(want[i].size(), 6u);
    }
  }
  runner::CpuRunnerOptions ro;
  ro.block_size = 16;
  ro.num_kv_blocks = 64;
  auto cpu = runner::CpuModelRunner::Create(model_, ro);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EngineOptions eo;
  eo.scheduler.max_num_batched_tokens = 256;
  eo.scheduler.max_num_seqs = 8;
  eo.scheduler.max_model_len = 512;
  eo.scheduler.watermark = 0;
  eo.eos_token_ids = {2};
  eo.device_sampling = true;
  auto engine =
      Engine::Create(std::make_unique<OutOfVocabSampler>(std::move(*cpu), /*bad_step=*/3), eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // Both submitted before the loop starts: one step holds both prompts.
  std::shared_ptr<RequestStream> streams[2];
  for (int i = 0; i < 2; ++i) {
    auto s = (*engine)->Submit(Greedy(prompts[i], 6));
    ASSERT_TRUE(s.ok()) << s.status();
    streams[i] = *s;
  }
  (*engine)->Start();
  int failed = 0;
  for (int i = 0; i < 2; ++i) {
    StreamEvent end;
    std::vector<TokenId> got = Collect(*streams[i], &end);
    if (end.error.ok()) {
      EXPECT_EQ(got, want[i]) << "request " << i;
      continue;
    }
    ++failed;
    EXPECT_EQ(end.error.code(), absl::StatusCode::kInternal) << end.error;
    EXPECT_THAT(std::string(end.error.message()),
                HasSubstr("returned token id 512, outside the vocabulary of 512"));
    EXPECT_EQ(got.size(), 2u);  // the prefill's token and the first decode step's
  }
  EXPECT_EQ(failed, 1);
  (*engine)->Stop();
  EXPECT_EQ((*engine)->Load().kv_blocks_used, 0);
}

}  // namespace
}  // namespace tessera::engine
