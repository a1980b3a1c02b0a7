// The engine loop with the CPU runner on a small random model: batch
// invariance (also across preemption), prefix caching, cancellation and
// backpressure.
#include "worker/engine/engine.h"

#include <cstdlib>
#include <random>

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

}  // namespace
}  // namespace tessera::engine
