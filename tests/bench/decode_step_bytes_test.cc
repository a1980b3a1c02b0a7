#include "tests/bench/decode_step_bytes.h"

#include "gtest/gtest.h"
#include "tests/bench/llama3_8b_config.h"
#include "tests/bench/qwen3_30b_a3b_config.h"

namespace tessera::bench {
namespace {

model::ModelConfig Parse(const char* json) {
  absl::StatusOr<model::ModelConfig> c = model::ParseModelConfig(json, "test");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Llama-3-8B has 8,030,261,248 parameters (bf16: 16,060,522,496 bytes),
// 266,240 of them in norms. A batch-1 step at context 0 reads all of them
// but the embedding table (128256 x 4096), plus one row, with the norms
// in fp32: 16,060,522,496 - 1,050,673,152 + 8,192 + 532,480.
TEST(DecodeStepBytesTest, DenseStepReadsOneEmbeddingRowNotTheTable) {
  const model::ModelConfig c = Parse(kLlama3_8BConfig);
  const StepBytes b = DecodeStepBytes(c, 1, 0);
  EXPECT_DOUBLE_EQ(b.total(), 15010390016.0);
  EXPECT_DOUBLE_EQ(b.embedding_rows, 8192.0);
  EXPECT_DOUBLE_EQ(b.lm_head, 1050673152.0);
  EXPECT_DOUBLE_EQ(b.routers + b.selected_experts, 0.0);
  // 64 tokens: 63 more embedding rows and their KV (32 layers, K and V of
  // 8 x 128 bf16 per position).
  const StepBytes b64 = DecodeStepBytes(c, 64, 100);
  EXPECT_DOUBLE_EQ(b64.total() - b.total(), 63 * 8192.0 + 64 * 100 * 32 * 2 * 1024 * 2.0);
}

// FP8 layers (gpu_decode_bench --fp8): 1 byte per layer weight (Llama-3-8B:
// 13,958,643,712 bf16 bytes -> 6,979,321,856), the LM head and embedding
// row still bf16, norms fp32, the scales as extra bytes: about 8.0 GB, as
// issue #34 counts.
TEST(DecodeStepBytesTest, Fp8LayersKeepTheHeadInBf16) {
  const model::ModelConfig c = Parse(kLlama3_8BConfig);
  StepBytesOptions o;
  o.weight_bytes_per_element = 1;
  o.head_bytes_per_element = 2;
  o.extra_bytes = 1000;
  const StepBytes b = DecodeStepBytes(c, 1, 0, o);
  EXPECT_DOUBLE_EQ(b.attention_weights + b.dense_and_shared_mlp, 6979321856.0);
  EXPECT_DOUBLE_EQ(b.lm_head, 1050673152.0);
  EXPECT_DOUBLE_EQ(b.embedding_rows, 8192.0);
  EXPECT_DOUBLE_EQ(b.total(), 6979321856.0 + 1050673152.0 + 8192.0 + 1064960.0 + 1000.0);
}

// The count gpu_decode_bench used for Qwen3-30B-A3B before the dense path
// shared it: batch 1 at mean context 193.5 (128-token prompt, 128 steps)
// read 6,103,183,360 bytes (moe_decode_qwen3_30b_a3b_h200.json).
TEST(DecodeStepBytesTest, MoeStepMatchesTheRecordedCount) {
  const model::ModelConfig c = Parse(kQwen3_30BA3BConfig);
  const StepBytes b = DecodeStepBytes(c, 1, 193.5);
  EXPECT_DOUBLE_EQ(b.total(), 6103183360.0);
  EXPECT_DOUBLE_EQ(b.selected_experts_per_layer, 8.0);
  EXPECT_NEAR(DecodeStepBytes(c, 64, 193.5).selected_experts_per_layer, 125.9, 0.05);
}

TEST(DecodeStepBytesTest, Fp8HalvesTheMatricesAndAddsItsScales) {
  const model::ModelConfig c = Parse(kLlama3_8BConfig);
  StepBytesOptions fp8;
  fp8.weight_bytes_per_element = 1.0;
  fp8.extra_bytes = 1000;
  const StepBytes bf16 = DecodeStepBytes(c, 1, 0), q = DecodeStepBytes(c, 1, 0, fp8);
  EXPECT_DOUBLE_EQ(q.attention_weights * 2, bf16.attention_weights);
  EXPECT_DOUBLE_EQ(q.norms, bf16.norms);
  EXPECT_DOUBLE_EQ(q.total(), (bf16.total() - bf16.norms) / 2 + bf16.norms + 1000);
}

}  // namespace
}  // namespace tessera::bench
