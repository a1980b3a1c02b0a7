// Mixture-of-experts layers on tensor-parallel CPU ranks, in both modes of
// --moe_parallel: "tensor" (every rank holds a slice of every expert) and
// "expert" (every rank holds whole experts; the all-reduce after the MLP
// sums the ranks' partial combines, which is how tokens' expert outputs
// are exchanged). The shard plans and their errors, then greedy parity with
// one rank on the MoE fixtures at 2 and 4 ranks: the same tokens, and
// logits within
//   max |logit_n - logit_1| <= 1e-5 * max(1, max |logit_1|)
// (the partial sums are added in another order than one rank's GEMM and
// combine; routing is computed identically on every rank).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/parallel/shard_plan.h"
#include "worker/parallel/tensor_parallel_runner.h"
#include "worker/runner/cpu_model_runner.h"

namespace tessera::parallel {
namespace {

using ::testing::HasSubstr;

std::string FixtureDir(const std::string& name) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return absl::StrCat(src ? src : ".", "/tests/fixtures/models/", name);
}

std::unique_ptr<model::LoadedModel> Load(const std::string& name) {
  auto m = model::LoadModel(FixtureDir(name));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(MoeShardPlanTest, TensorModeSlicesEveryExpertExpertModeSplitsTheExperts) {
  auto m = Load("glm4_moe_tiny");  // 16 experts of width 32, one shared expert of width 32
  ASSERT_NE(m, nullptr);
  auto tp = PlanShard(m->config, 1, 2, MoeParallelism::kTensor);
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(tp->experts.start, 0);
  EXPECT_EQ(tp->experts.size, 16);
  EXPECT_EQ(tp->expert_intermediate.start, 16);
  EXPECT_EQ(tp->expert_intermediate.size, 16);
  EXPECT_EQ(tp->shared_intermediate.start, 16);
  EXPECT_THAT(tp->ToString(), HasSubstr("tensor-parallel experts [0, 16) of width [16, 32)"));

  auto ep = PlanShard(m->config, 1, 4, MoeParallelism::kExpert);
  ASSERT_TRUE(ep.ok()) << ep.status();
  EXPECT_EQ(ep->experts.start, 4);
  EXPECT_EQ(ep->experts.size, 4);
  EXPECT_EQ(ep->expert_intermediate.size, 32) << "whole experts";
  EXPECT_EQ(ep->shared_intermediate.start, 8) << "shared experts split like a dense MLP";
  EXPECT_EQ(ep->shared_intermediate.size, 8);
  EXPECT_EQ(ep->moe_parallelism, MoeParallelism::kExpert);

  const ShardPlan full = FullPlan(m->config);
  EXPECT_EQ(full.experts.size, 16);
  EXPECT_EQ(full.expert_intermediate.size, 32);
}

TEST(MoeShardPlanTest, IndivisibleExpertsAndWidthsAreClearErrors) {
  auto m = Load("qwen3_moe_tiny");  // 8 experts of width 32; dense layer of width 160
  ASSERT_NE(m, nullptr);
  model::ModelConfig c = m->config;
  c.num_attention_heads = 12;  // lets 3 and 6 ranks through the attention checks
  c.num_key_value_heads = 6;
  c.intermediate_size = 192;
  EXPECT_THAT(std::string(CheckTensorParallel(c, 3, MoeParallelism::kExpert).message()),
              HasSubstr("--moe_parallel=expert: the model's 8 routed experts do not divide into "
                        "3 ranks; try --moe_parallel=tensor"));
  EXPECT_THAT(std::string(CheckTensorParallel(c, 3, MoeParallelism::kTensor).message()),
              HasSubstr("--moe_parallel=tensor: the experts' moe_intermediate_size 32 does not "
                        "divide into 3 ranks; try --moe_parallel=expert"));
  c.moe->num_shared_experts = 1;
  c.moe->intermediate_size = 36;  // 6 ranks: 36 / 6 per rank, but 8 experts / 6 do not split
  EXPECT_TRUE(CheckTensorParallel(c, 6, MoeParallelism::kTensor).ok());
  EXPECT_FALSE(CheckTensorParallel(c, 6, MoeParallelism::kExpert).ok());
  c.moe->num_shared_experts = 3;  // width 108: splits over 4 ranks, not 8
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.intermediate_size = 160;
  EXPECT_TRUE(CheckTensorParallel(c, 4, MoeParallelism::kExpert).ok());
  EXPECT_THAT(std::string(CheckTensorParallel(c, 8, MoeParallelism::kExpert).message()),
              HasSubstr("the shared experts' width 108 does not divide into 8 ranks"));
}

TEST(MoeShardPlanTest, ModeNames) {
  EXPECT_EQ(*ParseMoeParallelism("tensor"), MoeParallelism::kTensor);
  EXPECT_EQ(*ParseMoeParallelism("expert"), MoeParallelism::kExpert);
  EXPECT_EQ(MoeParallelismName(MoeParallelism::kExpert), "expert");
  EXPECT_THAT(std::string(ParseMoeParallelism("data").status().message()),
              HasSubstr("--moe_parallel=data: unknown mode; valid choices: tensor, expert"));
}

// The fixture's first prompt, then 16 greedy decode steps; every step's logits.
struct Generation {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

Generation Generate(runner::ModelRunner& r, const std::vector<int32_t>& prompt, int64_t vocab) {
  std::vector<int32_t> blocks(16);
  for (int i = 0; i < 16; ++i) blocks[i] = i;
  Generation g;
  runner::ForwardBatch prefill;
  prefill.block_table_stride = 16;
  prefill.AddSequence(prompt, 0, blocks, r.block_size(), false);
  for (int i = 0; i < prefill.num_tokens(); ++i) prefill.logits_indices.push_back(i);
  std::vector<float> logits;
  EXPECT_TRUE(r.Forward(prefill, &logits).ok());
  g.logits.push_back(logits);
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int step = 0; step < 16; ++step) {
    const float* last = logits.data() + logits.size() - vocab;
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
    g.tokens.push_back(next);
    runner::ForwardBatch decode;
    decode.block_table_stride = 16;
    decode.AddSequence({next}, pos++, blocks, r.block_size(), true);
    EXPECT_TRUE(r.Forward(decode, &logits).ok());
    g.logits.push_back(logits);
  }
  return g;
}

float RelativeError(const std::vector<float>& want, const std::vector<float>& got) {
  float scale = 1, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    err = std::max(err, std::abs(want[i] - got[i]));
  }
  return err / scale;
}

struct Case {
  std::string fixture;
  MoeParallelism mode;
  int ranks;
};

class MoeParallelParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoeParallelParityTest, SameGreedyTokensAndCloseLogitsAsOneRank) {
  const Case& c = GetParam();
  auto m = Load(c.fixture);
  ASSERT_NE(m, nullptr);
  std::ifstream in(FixtureDir(c.fixture) + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int32_t> prompt =
      nlohmann::json::parse(ss.str())["prompts"][2].get<std::vector<int32_t>>();
  const int64_t vocab = m->config.vocab_size;
  runner::CpuRunnerOptions ro;
  ro.block_size = 4;
  ro.num_kv_blocks = 16;
  ro.num_threads = 1;
  auto one = runner::CpuModelRunner::Create(m.get(), ro);
  ASSERT_TRUE(one.ok()) << one.status();
  const Generation want = Generate(**one, prompt, vocab);

  TensorParallelOptions tpo;
  tpo.tensor_parallel_size = c.ranks;
  tpo.moe_parallelism = c.mode;
  tpo.rank = ro;
  auto tp = TensorParallelRunner::Create(m.get(), tpo);
  ASSERT_TRUE(tp.ok()) << tp.status();
  const ShardPlan& last_rank = (*tp)->rank(c.ranks - 1).shard_plan();
  EXPECT_EQ(last_rank.moe_parallelism, c.mode);
  const Generation got = Generate(**tp, prompt, vocab);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  float worst = 0;
  for (size_t step = 0; step < want.logits.size(); ++step) {
    worst = std::max(worst, RelativeError(want.logits[step], got.logits[step]));
  }
  RecordProperty("max_relative_logit_error", absl::StrCat(worst));
  EXPECT_LE(worst, 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MoeParallelParityTest,
                         ::testing::Values(Case{"qwen3_moe_tiny", MoeParallelism::kTensor, 2},
                                           Case{"qwen3_moe_tiny", MoeParallelism::kExpert, 2},
                                           Case{"qwen3_moe_tiny", MoeParallelism::kExpert, 4},
                                           Case{"glm4_moe_tiny", MoeParallelism::kTensor, 2},
                                           Case{"glm4_moe_tiny", MoeParallelism::kExpert, 2},
                                           Case{"glm4_moe_tiny", MoeParallelism::kTensor, 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.fixture, "_",
                                               std::string(MoeParallelismName(info.param.mode)),
                                               info.param.ranks);
                         });

}  // namespace
}  // namespace tessera::parallel
