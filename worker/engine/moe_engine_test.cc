// The engine's batch invariance and prefix caching on a mixture-of-experts
// model: the GLM-4.5 fixture (tests/fixtures/models/glm4_moe_tiny: grouped
// sigmoid routing, a shared expert, a dense first layer, partial RoPE),
// served by the CPU runner. As engine_test.cc checks for dense models:
// greedy outputs do not depend on batching, chunking or preemption, and a
// request that reuses cached prefix blocks produces what it produces with
// none cached. Also: the worker's engine builder with --moe_parallel on 2
// CPU ranks gives one rank's tokens, and refuses an unknown mode.
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/engine/local_engine.h"
#include "worker/runner/cpu_model_runner.h"

namespace tessera::engine {
namespace {

using ::testing::HasSubstr;

std::string FixtureDir() {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/glm4_moe_tiny");
}

class MoeEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = model::LoadModel(FixtureDir());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() { delete model_; }

  std::unique_ptr<Engine> MakeEngine(int num_blocks, int max_batched_tokens = 256) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 16;
    ro.num_kv_blocks = num_blocks;
    auto r = runner::CpuModelRunner::Create(model_, ro);
    EXPECT_TRUE(r.ok()) << r.status();
    EngineOptions eo;
    eo.scheduler.max_num_batched_tokens = max_batched_tokens;
    eo.scheduler.max_num_seqs = 64;
    eo.scheduler.max_model_len = 256;  // the fixture's max_position_embeddings
    eo.scheduler.watermark = 0;
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
    for (auto& t : p) t = static_cast<TokenId>(3 + rng() % 380);
    return p;
  }

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

  static model::LoadedModel* model_;
};

model::LoadedModel* MoeEngineTest::model_ = nullptr;

TEST_F(MoeEngineTest, OutputsDoNotDependOnBatchingChunkingOrPreemption) {
  const int kRequests = 12;
  std::vector<EngineRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(Greedy(RandomPrompt(5 + (i * 37) % 120, i), 12 + (i * 7) % 20));
  }
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
  // Together, in chunks of 64 tokens, on a cache small enough to preempt.
  auto engine = MakeEngine(/*num_blocks=*/20, /*max_batched_tokens=*/64);
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
  }
  EXPECT_GT(engine->Load().preemptions, 0) << "the test meant to exercise preemption";
  EXPECT_EQ(engine->Load().kv_blocks_used, 0);
}

TEST_F(MoeEngineTest, CachedPrefixGivesTheUncachedOutput) {
  const std::vector<TokenId> prefix = RandomPrompt(128, 99);
  std::vector<TokenId> a = prefix, b = prefix;
  for (TokenId t : RandomPrompt(20, 1)) a.push_back(t);
  for (TokenId t : RandomPrompt(23, 2)) b.push_back(t);
  std::vector<TokenId> uncached;
  {
    auto fresh = MakeEngine(64);
    fresh->Start();
    auto s = fresh->Submit(Greedy(b, 16));
    ASSERT_TRUE(s.ok());
    StreamEvent last;
    uncached = Collect(**s, &last);
    EXPECT_EQ(last.cached_tokens, 0);
  }
  auto engine = MakeEngine(64);
  engine->Start();
  auto first = engine->Submit(Greedy(a, 16));
  ASSERT_TRUE(first.ok());
  Collect(**first, nullptr);
  auto second = engine->Submit(Greedy(b, 16));
  ASSERT_TRUE(second.ok());
  StreamEvent last;
  EXPECT_EQ(Collect(**second, &last), uncached);
  EXPECT_EQ(last.cached_tokens, 128) << "the 8 shared blocks of 16";
}

std::vector<int32_t> GenerateWithLocalEngine(int tp, const std::string& moe_parallel) {
  LocalEngineOptions lo;
  lo.model_dir = FixtureDir();
  lo.tensor_parallel_size = tp;
  lo.moe_parallel = moe_parallel;
  lo.kv_cache_blocks = 32;
  lo.cpu_threads = 2;
  auto local = BuildLocalEngine(lo);
  EXPECT_TRUE(local.ok()) << local.status();
  if (!local.ok()) return {};
  (*local)->engine->Start();
  EngineRequest req;
  req.request_id = "moe";
  req.prompt = {12, 300, 7, 199, 45, 30, 5};
  req.max_tokens = 24;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  auto stream = (*local)->engine->Submit(req);
  EXPECT_TRUE(stream.ok()) << stream.status();
  if (!stream.ok()) return {};
  std::vector<int32_t> out;
  StreamEvent event;
  while ((*stream)->Next(&event, absl::Seconds(60))) {
    EXPECT_TRUE(event.error.ok()) << event.error;
    for (const auto& t : event.tokens) out.push_back(t.token);
    if (event.finished) break;
  }
  return out;
}

TEST(MoeLocalEngineTest, MoeParallelModesGiveOneRanksTokens) {
  const std::vector<int32_t> one = GenerateWithLocalEngine(1, "tensor");
  ASSERT_EQ(one.size(), 24u);
  EXPECT_EQ(GenerateWithLocalEngine(2, "tensor"), one);
  EXPECT_EQ(GenerateWithLocalEngine(2, "expert"), one);

  LocalEngineOptions lo;
  lo.model_dir = FixtureDir();
  lo.tensor_parallel_size = 2;
  lo.moe_parallel = "pipeline";
  auto bad = BuildLocalEngine(lo);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("--moe_parallel=pipeline: unknown mode; valid choices: tensor, expert"));
}

}  // namespace
}  // namespace tessera::engine
