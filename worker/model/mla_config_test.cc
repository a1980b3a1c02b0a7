// DeepSeek-V3 / Kimi K2 configs (DeepseekV3ForCausalLM): the multi-head
// latent attention keys, YaRN and its softmax-scale correction, DeepSeek's
// routing keys, the strict refusals, and the latent KV cache's size per
// token against the formula at DeepSeek-V3's real dimensions.
#include <cmath>
#include <numbers>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/capabilities.h"
#include "worker/model/config.h"
#include "worker/model/kv_cache_size.h"
#include "worker/model/rope.h"

namespace tessera::model {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// DeepSeek-V3's config.json (auto_map and a few unused keys left out).
constexpr char kDeepseekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";

// Kimi K2's config.json (the keys that matter here).
constexpr char kKimiK2[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "vocab_size": 163840,
  "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
  "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
  "n_shared_experts": 1, "n_routed_experts": 384, "routed_scaling_factor": 2.827,
  "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
  "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 1,
  "norm_topk_prob": true, "scoring_func": "sigmoid", "aux_loss_alpha": 0.001, "seq_aux": true,
  "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
  "pad_token_id": 163839, "bos_token_id": 163584, "eos_token_id": 163585,
  "rope_theta": 50000.0,
  "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "attention_bias": false, "torch_dtype": "bfloat16", "num_nextn_predict_layers": 0})";

// A tiny config as transformers 5 writes it (rope_parameters, head_dim =
// qk_rope_head_dim, q_lora_rank null).
constexpr char kTinyV5[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 384,
  "hidden_size": 64, "intermediate_size": 160, "moe_intermediate_size": 32,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
  "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
  "v_head_dim": 24, "n_routed_experts": 16, "n_group": 4, "topk_group": 2,
  "num_experts_per_tok": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
  "routed_scaling_factor": 2.5, "max_position_embeddings": 1024, "rope_interleave": true,
  "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                      "original_max_position_embeddings": 256, "beta_fast": 32.0,
                      "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5},
  "dtype": "float32"})";

nlohmann::json Parsed(const char* text) { return nlohmann::json::parse(text); }

absl::StatusOr<ModelConfig> With(const char* base, const nlohmann::json& patch) {
  nlohmann::json j = Parsed(base);
  j.merge_patch(patch);
  return ParseModelConfig(j.dump());
}

TEST(MlaConfigTest, DeepseekV3ParsesItsRealConfig) {
  auto c = ParseModelConfig(kDeepseekV3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kDeepseekV3);
  ASSERT_TRUE(c->mla.has_value());
  const MlaConfig& m = *c->mla;
  EXPECT_EQ(m.q_lora_rank, 1536);
  EXPECT_EQ(m.kv_lora_rank, 512);
  EXPECT_EQ(m.qk_nope_head_dim, 128);
  EXPECT_EQ(m.qk_rope_head_dim, 64);
  EXPECT_EQ(m.v_head_dim, 128);
  EXPECT_TRUE(m.rope_interleave);
  EXPECT_EQ(m.latent_dim(), 576);
  EXPECT_EQ(c->head_dim, 64);  // the RoPE table's width, as transformers
  // YaRN: factor 40, mscale = mscale_all_dim = 1: cos/sin unscaled, the
  // softmax scale multiplied by (0.1 ln 40 + 1)^2.
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(m.rope_attention_factor, 1.0);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(m.softmax_scale, mscale * mscale / std::sqrt(192.0));
  // Routing: DeepSeek's keys, MTP layer recognised.
  ASSERT_TRUE(c->moe.has_value());
  EXPECT_EQ(c->moe->scoring, MoeScoring::kSigmoidGrouped);
  EXPECT_EQ(c->moe->num_experts, 256);
  EXPECT_EQ(c->moe->top_k, 8);
  EXPECT_EQ(c->moe->n_group, 8);
  EXPECT_EQ(c->moe->topk_group, 4);
  EXPECT_EQ(c->moe->num_shared_experts, 1);
  EXPECT_DOUBLE_EQ(c->moe->routed_scaling_factor, 2.5);
  EXPECT_FALSE(c->IsSparseLayer(2));
  EXPECT_TRUE(c->IsSparseLayer(3));
  EXPECT_TRUE(c->IsSparseLayer(60));
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  EXPECT_TRUE(c->quantization.has_value());
}

TEST(MlaConfigTest, KimiK2LoadsByItsModelType) {
  auto c = ParseModelConfig(kKimiK2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kDeepseekV3);
  EXPECT_EQ(c->model_type, "kimi_k2");
  EXPECT_EQ(c->moe->num_experts, 384);
  EXPECT_EQ(c->moe->n_group, 1);
  EXPECT_TRUE(c->IsSparseLayer(1));
  EXPECT_FALSE(c->IsSparseLayer(0));
  EXPECT_EQ(c->mla->kv_lora_rank, 512);
  const double mscale = 0.1 * std::log(32.0) + 1.0;
  EXPECT_DOUBLE_EQ(c->mla->softmax_scale, mscale * mscale / std::sqrt(192.0));
  // model_type alone, without architectures.
  nlohmann::json j = Parsed(kKimiK2);
  j.erase("architectures");
  auto by_type = ParseModelConfig(j.dump());
  ASSERT_TRUE(by_type.ok()) << by_type.status();
  EXPECT_EQ(by_type->architecture, ModelArchitecture::kDeepseekV3);
}

TEST(MlaConfigTest, TransformersFiveConfigWithPlainQProjAndMscales) {
  auto c = ParseModelConfig(kTinyV5);
  ASSERT_TRUE(c.ok()) << c.status();
  const MlaConfig& m = *c->mla;
  EXPECT_EQ(m.q_lora_rank, 0);  // null: plain q_proj
  EXPECT_EQ(m.qk_head_dim(), 48);
  EXPECT_EQ(c->rotary_dim(), 16);
  // mscale 1 and mscale_all_dim 0.5 differ: cos/sin get their ratio.
  const double m1 = 0.1 * 1.0 * std::log(4.0) + 1.0, mh = 0.1 * 0.5 * std::log(4.0) + 1.0;
  EXPECT_DOUBLE_EQ(m.rope_attention_factor, m1 / mh);
  EXPECT_DOUBLE_EQ(m.softmax_scale, mh * mh / std::sqrt(48.0));
  // Without mscale_all_dim the softmax scale is plain and cos/sin get
  // mscale(factor) = 0.1 ln 4 + 1.
  auto plain = With(kTinyV5, {{"rope_parameters", {{"mscale_all_dim", nullptr}}}});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_DOUBLE_EQ(plain->mla->softmax_scale, 1.0 / std::sqrt(48.0));
  EXPECT_DOUBLE_EQ(plain->mla->rope_attention_factor, 0.1 * std::log(4.0) + 1.0);
  // Default RoPE: no correction at all.
  auto none = With(kTinyV5, {{"rope_parameters", {{"rope_type", "default"}}}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_DOUBLE_EQ(none->mla->softmax_scale, 1.0 / std::sqrt(48.0));
  EXPECT_DOUBLE_EQ(none->mla->rope_attention_factor, 1.0);
  auto no_interleave = With(kTinyV5, {{"rope_interleave", false}});
  ASSERT_TRUE(no_interleave.ok());
  EXPECT_FALSE(no_interleave->mla->rope_interleave);
}

TEST(MlaConfigTest, RefusesWhatItCannotRunWithClearErrors) {
  struct Case {
    nlohmann::json patch;
    const char* message;
  };
  const Case cases[] = {
      {{{"topk_method", "greedy"}}, "topk_method \"greedy\" is not supported"},
      {{{"scoring_func", "softmax"}}, "scoring_func \"softmax\" is not supported"},
      {{{"moe_layer_freq", 2}}, "moe_layer_freq = 2 is not supported"},
      {{{"attention_bias", true}}, "attention_bias = true is not supported"},
      {{{"qk_rope_head_dim", 63}}, "qk_rope_head_dim = 63 must be even"},
      {{{"kv_lora_rank", 0}}, "kv_lora_rank = 0 must be >= 1"},
      {{{"v_head_dim", "128"}}, "v_head_dim must be an integer"},
      {{{"num_key_value_heads", 16}}, "must equal num_attention_heads = 128"},
      {{{"rope_scaling", {{"factor", nullptr}}}}, "rope_scaling.factor is required"},
      {{{"rope_scaling", {{"factor", 0.5}}}}, "rope_scaling.factor = 0.5 must be >= 1"},
      {{{"rope_scaling", {{"type", "linear"}}}}, "supports the rope types default and yarn"},
      {{{"n_group", 7}}, "n_group = 7 does not divide the 256 routed experts"},
      {{{"rope_interleave", 1}}, "rope_interleave must be true or false"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.patch.dump());
    auto parsed = With(kDeepseekV3, c.patch);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(parsed.status()), HasSubstr(c.message));
  }
}

TEST(MlaConfigTest, YarnIsRefusedForOtherArchitectures) {
  constexpr char kLlama[] = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 64,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 1024}})";
  auto c = ParseModelConfig(kLlama);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Msg(c.status()), HasSubstr("supported for DeepseekV3ForCausalLM only"));
}

// (512 + 64) x 2 bytes per layer in bf16 at DeepSeek-V3's dimensions.
TEST(MlaConfigTest, LatentKvBytesPerTokenAtDeepseekV3Dimensions) {
  auto c = ParseModelConfig(kDeepseekV3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(KvCacheValuesPerTokenLayer(*c), 512 + 64);
  EXPECT_EQ(KvCacheBytesPerToken(*c, 2), int64_t{61} * (512 + 64) * 2);
  EXPECT_EQ(KvCacheBytesPerToken(*c, 2) / c->num_hidden_layers, 1152);
  // The same heads as plain GQA would cache 2 x 128 x 64 values per layer
  // (head_dim is the RoPE width); the latent is what the runners store.
  ModelConfig gqa = *c;
  gqa.mla.reset();
  EXPECT_EQ(KvCacheValuesPerTokenLayer(gqa), 2 * 128 * 64);
}

// YaRN's table: dims below the correction range keep the default frequency
// (extrapolation), dims above it are divided by the factor (interpolation),
// and the ramp blends linearly in between.
TEST(MlaConfigTest, YarnInverseFrequenciesFollowTheRamp) {
  RopeScaling y;
  y.type = RopeScalingType::kYarn;
  y.factor = 40;
  y.original_max_position_embeddings = 4096;
  const int64_t d = 64;
  auto freqs = RopeInverseFrequencies(d, 10000.0, y);
  ASSERT_TRUE(freqs.ok()) << freqs.status();
  auto plain = RopeInverseFrequencies(d, 10000.0, RopeScaling{});
  ASSERT_TRUE(plain.ok());
  auto corr = [&](double rotations) {
    return d * std::log(4096.0 / (rotations * 2 * std::numbers::pi)) / (2 * std::log(10000.0));
  };
  const double low = std::max(std::floor(corr(32)), 0.0);
  const double high = std::min(std::ceil(corr(1)), double(d - 1));
  ASSERT_LT(low, high);
  for (int64_t i = 0; i < d / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = (*plain)[i] / 40.0 * ramp + (*plain)[i] * (1 - ramp);
    EXPECT_NEAR((*freqs)[i], want, 2e-6 * (*plain)[i]) << "dim " << i;
  }
  EXPECT_FLOAT_EQ((*freqs)[0], (*plain)[0]);
  EXPECT_NEAR((*freqs)[d / 2 - 1], (*plain)[d / 2 - 1] / 40.0f, 1e-6 * (*plain)[d / 2 - 1]);
}

TEST(MlaConfigTest, CudaRunnerCapabilityRefusesMlaClearly) {
  auto c = ParseModelConfig(kKimiK2);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status s = CheckCudaRunnerSupports(*c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(s), HasSubstr("\"kimi_k2\") uses multi-head latent attention"));
  EXPECT_THAT(Msg(s), HasSubstr("--device=cpu"));
  ModelConfig dense = *c;
  dense.mla.reset();
  EXPECT_TRUE(CheckCudaRunnerSupports(dense).ok());
}

}  // namespace
}  // namespace tessera::model
