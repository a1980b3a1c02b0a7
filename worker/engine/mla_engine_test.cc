// The engine on a multi-head latent attention model (a random
// DeepseekV3ForCausalLM from test_model.h: YaRN, q_lora_rank, grouped
// routing with a shared expert, a dense first layer) served by the CPU
// runner over its latent KV cache: greedy outputs do not depend on
// batching, chunking or preemption, a request that reuses cached prefix
// blocks produces what it produces with none cached, and the worker's
// engine builder sizes the cache from memory by the latent bytes per token.
#include <cstdlib>
#include <random>

#include "gtest/gtest.h"
#include "worker/engine/engine.h"
#include "worker/engine/local_engine.h"
#include "worker/model/kv_cache_size.h"
#include "worker/runner/cpu_model_runner.h"
#include "worker/runner/test_model.h"

namespace tessera::engine {
namespace {

std::string WriteModel() {
  std::string pattern = "/tmp/tessera-mla-engine-XXXXXX";
  const char* dir = mkdtemp(pattern.data());
  EXPECT_NE(dir, nullptr);
  runner::TestModelSpec s;
  s.architecture = "DeepseekV3ForCausalLM";
  s.vocab = 384;
  s.layers = 3;
  s.heads = 4;
  s.kv_heads = 4;
  s.experts = 8;
  s.top_k = 2;
  s.groups = 4;
  s.topk_groups = 2;
  s.routed_scaling = 2.5;
  s.first_dense_layers = 1;
  s.max_positions = 1024;
  s.weight_scale = 0.3f;
  absl::Status st = runner::WriteTestModel(dir, s);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

class MlaEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(WriteModel());
    auto m = model::LoadModel(*dir_);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete dir_;
  }

  std::unique_ptr<Engine> MakeEngine(int num_blocks, int max_batched_tokens = 256,
                                     bool prefix_caching = true) {
    runner::CpuRunnerOptions ro;
    ro.block_size = 8;
    ro.num_kv_blocks = num_blocks;
    auto r = runner::CpuModelRunner::Create(model_, ro);
    EXPECT_TRUE(r.ok()) << r.status();
    EngineOptions eo;
    eo.scheduler.max_num_batched_tokens = max_batched_tokens;
    eo.scheduler.max_num_seqs = 64;
    eo.scheduler.max_model_len = 512;
    eo.scheduler.watermark = 0;
    eo.scheduler.enable_prefix_caching = prefix_caching;
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

  static std::vector<TokenId> Collect(RequestStream& s) {
    std::vector<TokenId> tokens;
    StreamEvent e;
    while (true) {
      if (!s.Next(&e, absl::Seconds(120))) {
        ADD_FAILURE() << "stream timed out";
        return tokens;
      }
      EXPECT_TRUE(e.error.ok()) << e.error;
      for (const TokenReport& t : e.tokens) tokens.push_back(t.token);
      if (e.finished) break;
    }
    return tokens;
  }

  static std::string* dir_;
  static model::LoadedModel* model_;
};

std::string* MlaEngineTest::dir_ = nullptr;
model::LoadedModel* MlaEngineTest::model_ = nullptr;

TEST_F(MlaEngineTest, OutputsDoNotDependOnBatchingChunkingOrPreemption) {
  const int kRequests = 8;
  std::vector<EngineRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(Greedy(RandomPrompt(5 + (i * 37) % 90, i), 10 + (i * 7) % 12));
  }
  std::vector<std::vector<TokenId>> alone;
  {
    auto engine = MakeEngine(256);
    engine->Start();
    for (const EngineRequest& r : requests) {
      auto s = engine->Submit(r);
      ASSERT_TRUE(s.ok()) << s.status();
      alone.push_back(Collect(**s));
    }
  }
  auto engine = MakeEngine(/*num_blocks=*/24, /*max_batched_tokens=*/48);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) {
    auto s = engine->Submit(r);
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  engine->Start();
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(Collect(*streams[i]), alone[i]) << "request " << i;
}

TEST_F(MlaEngineTest, PrefixCacheHitsGiveTheSameTokens) {
  const std::vector<TokenId> shared = RandomPrompt(40, 99);
  std::vector<TokenId> a = shared, b = shared;
  a.push_back(7);
  b.push_back(11);
  std::vector<TokenId> cold;
  {
    auto engine = MakeEngine(128, 256, /*prefix_caching=*/false);
    engine->Start();
    auto s = engine->Submit(Greedy(b, 12));
    ASSERT_TRUE(s.ok());
    cold = Collect(**s);
  }
  auto engine = MakeEngine(128);
  engine->Start();
  auto first = engine->Submit(Greedy(a, 12));
  ASSERT_TRUE(first.ok());
  Collect(**first);
  auto second = engine->Submit(Greedy(b, 12));  // reuses the shared prefix's latent blocks
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Collect(**second), cold);
}

TEST_F(MlaEngineTest, BuilderSizesTheCacheByLatentBytesPerToken) {
  LocalEngineOptions lo;
  lo.model_dir = *dir_;
  lo.block_size = 8;
  lo.kv_cache_memory_mb = 1;
  lo.cpu_threads = 1;
  lo.max_model_len = 512;
  auto local = BuildLocalEngine(lo);
  ASSERT_TRUE(local.ok()) << local.status();
  const model::ModelConfig& c = (*local)->config();
  ASSERT_TRUE(c.mla.has_value());
  // 3 layers x (32 + 8) fp32 values per token.
  const int64_t per_token = model::KvCacheBytesPerToken(c, 4);
  EXPECT_EQ(per_token, 3 * (32 + 8) * 4);
  EXPECT_EQ((*local)->kv_cache_blocks, (int64_t{1} << 20) / (per_token * 8));
}

}  // namespace
}  // namespace tessera::engine
