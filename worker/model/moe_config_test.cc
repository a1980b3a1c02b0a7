// The mixture-of-experts architectures' configs: Qwen3-MoE and GLM-4.5, as
// their released config.json files and the fixtures spell them, and the
// validation of routing parameters.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/config.h"

namespace tessera::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Qwen3-30B-A3B's config.json (the keys that matter here).
constexpr char kQwen3Moe30B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
  "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
  "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
  "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})";

// GLM-4.5-Air's config.json (the keys that matter here).
constexpr char kGlm45Air[] = R"({
  "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
  "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "partial_rotary_factor": 0.5, "intermediate_size": 10944,
  "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
  "norm_topk_prob": true, "num_attention_heads": 96, "n_group": 1, "topk_group": 1,
  "n_routed_experts": 128, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
  "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_hidden_layers": 46,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
  "num_nextn_predict_layers": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_qk_norm": false, "vocab_size": 151552})";

// The grouped-routing fixture's config (tests/fixtures/models/glm4_moe_tiny),
// as transformers 5.17 saved it: partial_rotary_factor both at the top level
// and inside rope_parameters.
constexpr char kGlmTiny[] = R"({
  "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "bos_token_id": 1,
  "dtype": "float32", "eos_token_id": 2, "first_k_dense_replace": 1, "head_dim": 32,
  "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 160,
  "max_position_embeddings": 256, "model_type": "glm4_moe", "moe_intermediate_size": 32,
  "n_group": 4, "n_routed_experts": 16, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 4, "num_experts_per_tok": 4, "num_hidden_layers": 3,
  "num_key_value_heads": 2, "num_nextn_predict_layers": 0, "pad_token_id": 0,
  "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
  "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                      "rope_type": "default"},
  "routed_scaling_factor": 2.5, "tie_word_embeddings": false, "topk_group": 2,
  "use_qk_norm": true, "vocab_size": 384})";

// The softmax-routing fixture's config (qwen3_moe_tiny): transformers 5
// writes num_local_experts, not num_experts.
constexpr char kQwenTiny[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "decoder_sparse_step": 1,
  "head_dim": 32, "hidden_size": 64, "intermediate_size": 160, "max_position_embeddings": 256,
  "mlp_only_layers": [1], "moe_intermediate_size": 32, "norm_topk_prob": true,
  "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3,
  "num_key_value_heads": 2, "num_local_experts": 8, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "use_sliding_window": false, "vocab_size": 384})";

// `text` with the first occurrence of `from` replaced by `to`.
std::string Edit(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(MoeConfigTest, Qwen3Moe30B) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3Moe30B);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kQwen3Moe);
  EXPECT_EQ(ArchitectureName(c->architecture), "Qwen3MoeForCausalLM");
  EXPECT_EQ(c->model_type, "qwen3_moe");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->rotary_dim(), 128);
  ASSERT_TRUE(c->moe.has_value());
  const MoeConfig& m = *c->moe;
  EXPECT_EQ(m.scoring, MoeScoring::kSoftmax);
  EXPECT_EQ(m.num_experts, 128);
  EXPECT_EQ(m.top_k, 8);
  EXPECT_EQ(m.intermediate_size, 768);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.num_shared_experts, 0);
  EXPECT_FALSE(m.has_correction_bias());
  for (int64_t l = 0; l < 48; ++l) EXPECT_TRUE(c->IsSparseLayer(l)) << l;
  EXPECT_FALSE(c->IsSparseLayer(48));
  EXPECT_FALSE(c->IsSparseLayer(-1));
  EXPECT_EQ(c->num_nextn_predict_layers, 0);
}

TEST(MoeConfigTest, Qwen3MoeLayerChoiceFollowsMlpOnlyLayersAndSparseStep) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwenTiny);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe->num_experts, 8) << "num_local_experts is read";
  EXPECT_THAT(c->moe->sparse_layers, ElementsAre(true, false, true));
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);

  // Every second layer (1-based): layers 1 and 3 of 0..3, minus mlp_only_layers.
  std::string every_other =
      Edit(kQwen3Moe30B, "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 2");
  every_other = Edit(every_other, "\"num_hidden_layers\": 48", "\"num_hidden_layers\": 4");
  c = ParseModelConfig(every_other);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->moe->sparse_layers, ElementsAre(false, true, false, true));
  c = ParseModelConfig(Edit(every_other, "\"mlp_only_layers\": []", "\"mlp_only_layers\": [3]"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->moe->sparse_layers, ElementsAre(false, true, false, false));

  // No experts at all: every layer dense, nothing routed, no error.
  c = ParseModelConfig(Edit(kQwen3Moe30B, "\"num_experts\": 128", "\"num_experts\": 0"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->IsSparseLayer(0));

  // Both spellings may be given when they agree.
  c = ParseModelConfig(Edit(kQwen3Moe30B, "\"num_experts\": 128",
                            "\"num_experts\": 128, \"num_local_experts\": 128"));
  ASSERT_TRUE(c.ok()) << c.status();
}

TEST(MoeConfigTest, Glm45Air) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGlm45Air);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kGlm4Moe);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_proj_bias) << "GLM-4.5's o_proj never has a bias";
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->rotary_dim(), 64);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  const MoeConfig& m = *c->moe;
  EXPECT_EQ(m.scoring, MoeScoring::kSigmoidGrouped);
  EXPECT_TRUE(m.has_correction_bias());
  EXPECT_EQ(m.num_experts, 128);
  EXPECT_EQ(m.num_shared_experts, 1);
  EXPECT_EQ(m.shared_intermediate_size(), 1408);
  EXPECT_FALSE(c->IsSparseLayer(0));
  for (int64_t l = 1; l < 46; ++l) EXPECT_TRUE(c->IsSparseLayer(l)) << l;
}

TEST(MoeConfigTest, GlmTinyFixtureGroupsAndPartialRope) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGlmTiny);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->rotary_dim(), 16);
  EXPECT_EQ(c->num_nextn_predict_layers, 0);
  const MoeConfig& m = *c->moe;
  EXPECT_EQ(m.n_group, 4);
  EXPECT_EQ(m.topk_group, 2);
  EXPECT_EQ(m.group_size(), 4);
  EXPECT_EQ(m.top_k, 4);
  EXPECT_DOUBLE_EQ(m.routed_scaling_factor, 2.5);
  EXPECT_THAT(m.sparse_layers, ElementsAre(false, true, true));
  // model_type alone names the architecture too.
  c = ParseModelConfig(Edit(kGlmTiny, "\"architectures\": [\"Glm4MoeForCausalLM\"],", ""));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kGlm4Moe);

  // Only inside rope_parameters; and absent everywhere: transformers' 0.5.
  std::string nested =
      Edit(kGlmTiny, "\"partial_rotary_factor\": 0.5, \"rms_norm_eps\"", "\"rms_norm_eps\"");
  c = ParseModelConfig(
      Edit(nested, "{\"partial_rotary_factor\": 0.5,", "{\"partial_rotary_factor\": 0.25,"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rotary_dim(), 8);
  c = ParseModelConfig(Edit(nested, "{\"partial_rotary_factor\": 0.5,", "{"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rotary_dim(), 16);
  // Every layer sparse.
  c = ParseModelConfig(
      Edit(kGlmTiny, "\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 0"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->moe->sparse_layers, ElementsAre(true, true, true));
}

struct BadMoeConfig {
  std::string name;
  const char* base;
  std::string from, to;
  std::string message;
};

class BadMoeConfigTest : public ::testing::TestWithParam<BadMoeConfig> {};

TEST_P(BadMoeConfigTest, IsAClearError) {
  const BadMoeConfig& p = GetParam();
  absl::StatusOr<ModelConfig> c = ParseModelConfig(Edit(p.base, p.from, p.to));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()), HasSubstr(p.message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadMoeConfigTest,
    ::testing::Values(
        BadMoeConfig{"TopKAboveExperts", kQwenTiny, "\"num_experts_per_tok\": 2",
                     "\"num_experts_per_tok\": 9",
                     "num_experts_per_tok = 9 exceeds the number of routed experts (8)"},
        BadMoeConfig{"TopKZero", kQwenTiny, "\"num_experts_per_tok\": 2",
                     "\"num_experts_per_tok\": 0", "num_experts_per_tok = 0 must be >= 1"},
        BadMoeConfig{"ExpertCountsDisagree", kQwenTiny, "\"num_local_experts\": 8",
                     "\"num_local_experts\": 8, \"num_experts\": 16",
                     "num_experts = 16 and num_local_experts = 8 disagree"},
        BadMoeConfig{"SparseStepZero", kQwenTiny, "\"decoder_sparse_step\": 1",
                     "\"decoder_sparse_step\": 0", "decoder_sparse_step = 0 must be >= 1"},
        BadMoeConfig{"MlpOnlyLayerOutside", kQwenTiny, "\"mlp_only_layers\": [1]",
                     "\"mlp_only_layers\": [1, 3]",
                     "mlp_only_layers[1] = 3 is not a layer index in [0, 3)"},
        BadMoeConfig{"GroupsDoNotDivide", kGlmTiny, "\"n_group\": 4", "\"n_group\": 3",
                     "n_group = 3 does not divide the 16 routed experts"},
        BadMoeConfig{"TopkGroupAboveGroups", kGlmTiny, "\"topk_group\": 2", "\"topk_group\": 5",
                     "topk_group = 5 exceeds n_group = 4"},
        BadMoeConfig{"TopKAboveChosenGroups", kGlmTiny, "\"num_experts_per_tok\": 4",
                     "\"num_experts_per_tok\": 9",
                     "num_experts_per_tok = 9 exceeds the experts of the topk_group = 2 chosen "
                     "groups (8)"},
        BadMoeConfig{"GroupOfOne", kGlmTiny, "\"n_group\": 4", "\"n_group\": 16",
                     "a group is scored by its top two experts, so it needs at least 2"},
        BadMoeConfig{"ScalingZero", kGlmTiny, "\"routed_scaling_factor\": 2.5",
                     "\"routed_scaling_factor\": 0", "routed_scaling_factor = 0 must be > 0"},
        BadMoeConfig{"NegativeSharedExperts", kGlmTiny, "\"n_shared_experts\": 1",
                     "\"n_shared_experts\": -1", "n_shared_experts = -1 must be >= 0"},
        BadMoeConfig{"DenseLayersBeyondTheModel", kGlmTiny, "\"first_k_dense_replace\": 1",
                     "\"first_k_dense_replace\": 4",
                     "first_k_dense_replace = 4 exceeds the limit of 3"},
        BadMoeConfig{"OddRotaryDims", kGlmTiny, "\"partial_rotary_factor\": 0.5, \"rms",
                     "\"partial_rotary_factor\": 0.3, \"rms",
                     "partial_rotary_factor = 0.3 gives 9 rotary dims of head_dim 32"},
        BadMoeConfig{"RotaryFactorAboveOne", kGlmTiny, "\"partial_rotary_factor\": 0.5, \"rms",
                     "\"partial_rotary_factor\": 1.5, \"rms",
                     "partial_rotary_factor = 1.5 must be <= 1"},
        // A GLM config relabelled DeepSeek-V3 is refused for its attention
        // bias (mla_config_test.cc covers DeepSeek-V3 itself).
        BadMoeConfig{"DeepSeekV3WithAttentionBias", kGlmTiny, "\"Glm4MoeForCausalLM\"",
                     "\"DeepseekV3ForCausalLM\"",
                     "attention_bias = true is not supported for DeepseekV3ForCausalLM"}),
    [](const ::testing::TestParamInfo<BadMoeConfig>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera::model
