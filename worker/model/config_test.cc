#include "worker/model/config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/test_util.h"

namespace tessera::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Shapes of public configs (Meta-Llama-3.1-8B, Qwen2.5-7B, Qwen3-8B,
// Mistral-7B-v0.1), as their config.json files spell them.
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256})";

constexpr char kQwen25[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 152064})";

constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
  "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "vocab_size": 32000})";

TEST(ModelConfigTest, Llama31) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kLlama);
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 14336);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 4096 / 32);
  EXPECT_EQ(c->queries_per_kv(), 4);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_proj_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->torch_dtype, DType::kBF16);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_TRUE(CheckContextLength(*c, 131072).ok());
}

TEST(ModelConfigTest, Qwen25HasQkvBiasAndNoActiveWindow) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen25);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kQwen2);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_proj_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151643));
  EXPECT_FALSE(c->sliding_window.has_value()) << "use_sliding_window is false";
}

TEST(ModelConfigTest, Qwen3HasQkNormAndIndependentHeadDim) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kQwen3);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_size(), 32 * 128);
  EXPECT_EQ(c->kv_size(), 8 * 128);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6) << "an integer rope_theta is accepted";

  // head_dim need not equal hidden / heads (Qwen3-0.6B: 1024 / 16 = 64, head_dim 128).
  std::string small = kQwen3;
  small.replace(small.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": 1024");
  small.replace(small.find("\"num_attention_heads\": 32"), 25, "\"num_attention_heads\": 16");
  c = ParseModelConfig(small);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_size(), 2048);
}

TEST(ModelConfigTest, MistralSlidingWindowLimitsTheContext) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMistral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kMistral);
  ASSERT_TRUE(c->sliding_window.has_value());
  EXPECT_EQ(*c->sliding_window, 4096);
  EXPECT_EQ(c->sliding_window_layers, 32);
  EXPECT_TRUE(CheckContextLength(*c, 4096).ok());
  absl::Status too_long = CheckContextLength(*c, 4097);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(too_long), HasSubstr("sliding_window = 4096"));
  EXPECT_THAT(Msg(too_long), HasSubstr("set max_model_len <= 4096"));
  EXPECT_THAT(Msg(CheckContextLength(*c, 40000)), HasSubstr("max_position_embeddings = 32768"));
  EXPECT_FALSE(CheckContextLength(*c, 0).ok());

  std::string no_window = kMistral;
  no_window.replace(no_window.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": null");
  c = ParseModelConfig(no_window);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->sliding_window.has_value());
}

TEST(ModelConfigTest, Qwen2SlidingWindowCountsLayersFromMaxWindowLayers) {
  std::string cfg = kQwen25;
  cfg.replace(cfg.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  cfg.replace(cfg.find("\"max_window_layers\": 28"), 23, "\"max_window_layers\": 20");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->sliding_window.has_value());
  EXPECT_EQ(c->sliding_window_layers, 28 - 20);
}

TEST(ModelConfigTest, LlamaAttentionAndMlpBias) {
  std::string cfg = kLlama31;
  cfg.replace(cfg.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  cfg.replace(cfg.find("\"mlp_bias\": false"), 17, "\"mlp_bias\": true");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_proj_bias);
  EXPECT_TRUE(c->mlp_bias);
}

TEST(ModelConfigTest, DefaultsAndModelTypeFallback) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({"model_type": "qwen3",
      "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "eos_token_id": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kQwen3);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_FALSE(c->torch_dtype.has_value());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_FALSE(c->bos_token_id.has_value());
}

TEST(ModelConfigTest, LinearRopeAndLegacyTypeKey) {
  std::string cfg = kLlama31;
  const size_t start = cfg.find("\"rope_scaling\"");
  const size_t end = cfg.find('}', start) + 1;
  cfg.replace(start, end - start, R"("rope_scaling": {"type": "linear", "factor": 2.0})");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(cfg);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 2.0);
}

// Files written by transformers' save_pretrained (testdata/, transformers
// 5.x: "dtype" and "rope_parameters" instead of torch_dtype/rope_scaling).
TEST(ModelConfigTest, TransformersSavedConfigs) {
  const std::string dir = testing::TestDataDir();
  absl::StatusOr<ModelConfig> llama = LoadModelConfig(dir + "/tiny_llama");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->torch_dtype, DType::kBF16);
  EXPECT_EQ(llama->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_DOUBLE_EQ(llama->rope_theta, 500000.0);
  EXPECT_EQ(llama->rope_scaling.original_max_position_embeddings, 32);
  EXPECT_TRUE(llama->qkv_bias && llama->o_proj_bias && llama->mlp_bias);

  absl::StatusOr<ModelConfig> qwen2 = LoadModelConfig(dir + "/tiny_qwen2/config.json");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_EQ(qwen2->torch_dtype, DType::kF16);
  EXPECT_TRUE(qwen2->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(qwen2->rope_theta, 1e6);
  EXPECT_FALSE(qwen2->sliding_window.has_value());

  absl::StatusOr<ModelConfig> qwen3 = LoadModelConfig(dir + "/tiny_qwen3");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->head_dim, 16);
  EXPECT_NE(qwen3->head_dim, qwen3->hidden_size / qwen3->num_attention_heads);

  absl::StatusOr<ModelConfig> mistral = LoadModelConfig(dir + "/tiny_mistral");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->sliding_window, 64);
}

TEST(ModelConfigTest, LoadReportsMissingFiles) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(testing::MakeTempDir());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(c.status()), HasSubstr("config.json: cannot open"));
}

// Each invalid config: a JSON edit of kLlama31 and the message it must give.
struct BadConfig {
  const char* name;
  const char* from;
  const char* to;
  const char* message;
};

class ModelConfigErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ModelConfigErrorTest, NamesTheFieldAndTheProblem) {
  const BadConfig& bad = GetParam();
  std::string cfg = kLlama31;
  const size_t at = cfg.find(bad.from);
  ASSERT_NE(at, std::string::npos) << bad.from;
  cfg.replace(at, std::string(bad.from).size(), bad.to);
  absl::StatusOr<ModelConfig> c = ParseModelConfig(cfg, "/m/config.json");
  ASSERT_FALSE(c.ok()) << bad.name;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(c.status()), StartsWith("/m/config.json: "));
  EXPECT_THAT(Msg(c.status()), HasSubstr(bad.message));
}

INSTANTIATE_TEST_SUITE_P(
    All, ModelConfigErrorTest,
    ::testing::Values(
        BadConfig{"UnknownArchitecture", "\"LlamaForCausalLM\"", "\"GPT2LMHeadModel\"",
                  "architecture \"GPT2LMHeadModel\" is not supported (supported: "
                  "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                  "Qwen3MoeForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM)"},
        BadConfig{"YarnRope", "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"",
                  "rope type \"yarn\" is supported for DeepseekV3ForCausalLM only (not "
                  "LlamaForCausalLM)"},
        BadConfig{"UnknownRopeType", "\"rope_type\": \"llama3\"", "\"rope_type\": \"longrope\"",
                  "rope_scaling type \"longrope\" is not supported (supported: default, linear, "
                  "llama3, yarn)"},
        BadConfig{"Llama3MissingField", "\"low_freq_factor\": 1.0, ", "",
                  "rope_scaling.low_freq_factor is required for rope type \"llama3\""},
        BadConfig{"Llama3FactorsInverted", "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5",
                  "llama3 scaling needs 0 < low_freq_factor < high_freq_factor"},
        BadConfig{"RopeFactorBelowOne", "\"factor\": 8.0", "\"factor\": 0.5",
                  "rope_scaling.factor = 0.5 must be >= 1"},
        BadConfig{"GqaNotDividing", "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5",
                  "num_attention_heads = 32 is not a multiple of num_key_value_heads = 5"},
        BadConfig{"FloatForInt", "\"num_hidden_layers\": 32", "\"num_hidden_layers\": 32.5",
                  "num_hidden_layers must be an integer, got number 32.5"},
        BadConfig{"AbsurdLayerCount", "\"num_hidden_layers\": 32",
                  "\"num_hidden_layers\": 1000000000",
                  "num_hidden_layers = 1000000000 exceeds the limit of 4096"},
        BadConfig{"AbsurdHeadDim", "\"hidden_act\"", "\"head_dim\": 1048576, \"hidden_act\"",
                  "head_dim = 1048576 exceeds the limit of 8192"},
        BadConfig{"ZeroLayers", "\"num_hidden_layers\": 32", "\"num_hidden_layers\": 0",
                  "num_hidden_layers = 0 must be >= 1"},
        BadConfig{"MissingVocab", "\"vocab_size\": 128256", "\"vocab\": 1",
                  "missing required vocab_size"},
        BadConfig{"HiddenNotDivisible", "\"hidden_size\": 4096", "\"hidden_size\": 4100",
                  "hidden_size = 4100 is not a multiple of num_attention_heads = 32 and no "
                  "head_dim is given"},
        BadConfig{"OddHeadDim", "\"hidden_act\"", "\"head_dim\": 7, \"hidden_act\"",
                  "head_dim = 7 must be even for rotary embeddings"},
        BadConfig{"Gelu", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"",
                  "hidden_act \"gelu\" is not supported (supported: silu)"},
        BadConfig{"NegativeEps", "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1",
                  "rms_norm_eps = -1 must be > 0"},
        BadConfig{"EosOutsideVocab", "128009]", "128256]",
                  "eos_token_id = 128256 is outside the vocabulary [0, 128256)"},
        BadConfig{"EosWrongType", "\"eos_token_id\": [128001, 128008, 128009]",
                  "\"eos_token_id\": \"</s>\"",
                  "eos_token_id must be an integer or a list of integers, got string"},
        BadConfig{"BadDtype", "\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"int4\"",
                  "unsupported torch_dtype \"int4\""},
        BadConfig{"TieNotBool", "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0",
                  "tie_word_embeddings must be true or false, got integer 0"},
        BadConfig{"DuplicateKey", "\"vocab_size\": 128256", "\"vocab_size\": 1, \"vocab_size\": 2",
                  "duplicate key \"vocab_size\" at the top level"},
        BadConfig{"NotJson", "{", "[", "invalid JSON at byte"},
        BadConfig{"TwoArchitectures", "[\"LlamaForCausalLM\"]",
                  "[\"LlamaForCausalLM\", \"MistralForCausalLM\"]",
                  "architectures lists 2 classes; expected exactly one"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera::model
