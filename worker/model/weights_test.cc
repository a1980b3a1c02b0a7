#include "worker/model/weights.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors_writer.h"
#include "worker/model/test_util.h"

namespace tessera::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A small Qwen2-style config: GQA 4/2, head_dim 4, q/k/v bias.
ModelConfig SmallQwen2() {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({"architectures": ["Qwen2ForCausalLM"],
      "vocab_size": 11, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Expected shape of every required tensor, from the config alone.
std::vector<int64_t> ExpectedShape(const ModelConfig& c, const std::string& name) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  auto ends = [&](std::string_view s) { return std::string_view(name).ends_with(s); };
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return {V, H};
  if (ends("layernorm.weight") || name == "model.norm.weight") return {H};
  if (ends("q_proj.weight")) return {c.q_size(), H};
  if (ends("k_proj.weight") || ends("v_proj.weight")) return {c.kv_size(), H};
  if (ends("o_proj.weight")) return {H, c.q_size()};
  if (ends("q_proj.bias")) return {c.q_size()};
  if (ends("k_proj.bias") || ends("v_proj.bias")) return {c.kv_size()};
  if (ends("o_proj.bias") || ends("down_proj.bias")) return {H};
  if (ends("q_norm.weight") || ends("k_norm.weight")) return {c.head_dim};
  if (ends("gate_proj.weight") || ends("up_proj.weight")) return {I, H};
  if (ends("down_proj.weight")) return {H, I};
  if (ends("gate_proj.bias") || ends("up_proj.bias")) return {I};
  ADD_FAILURE() << "unexpected tensor " << name;
  return {};
}

// Writes a checkpoint with every required tensor (BF16, values = index) and
// lets `edit` change the list first. Returns the opened checkpoint.
std::unique_ptr<Checkpoint> MakeCheckpoint(
    const ModelConfig& c, const std::function<void(std::vector<TensorToWrite>*)>& edit = {}) {
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : RequiredTensorNames(c)) {
    std::vector<int64_t> shape = ExpectedShape(c, name);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(tensors.size() + i % 7);
    tensors.push_back(*MakeTensor(name, DType::kBF16, shape, values));
  }
  if (edit) edit(&tensors);
  const std::string path = testing::MakeTempDir() + "/model.safetensors";
  EXPECT_TRUE(WriteSafetensorsFile(path, tensors).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(path);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  return ckpt.ok() ? *std::move(ckpt) : nullptr;
}

void Remove(std::vector<TensorToWrite>* tensors, const std::string& name) {
  std::erase_if(*tensors, [&](const TensorToWrite& t) { return t.name == name; });
}

TEST(ModelWeightsTest, BindsEveryTensorWithItsShape) {
  ModelConfig c = SmallQwen2();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c, [](std::vector<TensorToWrite>* t) {
    t->push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {0}, ""});
  });
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->layers.size(), 2u);
  EXPECT_EQ(w->embed_tokens.shape, (std::vector<int64_t>{11, 16}));
  EXPECT_EQ(w->layers[1].q_proj.name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(w->layers[1].k_proj.shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(w->layers[1].o_proj.shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(w->layers[0].down_proj.shape, (std::vector<int64_t>{16, 24}));
  ASSERT_TRUE(w->layers[0].q_bias.has_value());
  EXPECT_EQ(w->layers[0].v_bias->shape, (std::vector<int64_t>{8}));
  EXPECT_FALSE(w->layers[0].o_bias.has_value());
  EXPECT_FALSE(w->layers[0].q_norm.has_value());
  EXPECT_FALSE(w->lm_head_tied);
  EXPECT_EQ(w->lm_head.name, "lm_head.weight");
  EXPECT_EQ(w->layers[0].gate_proj.dtype, DType::kBF16);
  // The view points into the checkpoint's mapping: same bytes as a lookup.
  EXPECT_EQ(w->norm.data, ckpt->Find("model.norm.weight")->data);
  EXPECT_EQ(w->unused_tensors,
            (std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq"}));
}

TEST(ModelWeightsTest, TiedEmbeddingsReuseTheEmbedding) {
  ModelConfig c = SmallQwen2();
  c.tie_word_embeddings = true;
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c);
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->lm_head_tied);
  EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);
}

TEST(ModelWeightsTest, MissingTensorNamesItAndItsShape) {
  ModelConfig c = SmallQwen2();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(
      c, [](std::vector<TensorToWrite>* t) { Remove(t, "model.layers.1.self_attn.k_proj.bias"); });
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(w.status()), HasSubstr("missing tensor \"model.layers.1.self_attn.k_proj.bias\" "
                                         "(expected shape [8])"));
}

TEST(ModelWeightsTest, MissingLmHeadWhenNotTied) {
  ModelConfig c = SmallQwen2();
  std::unique_ptr<Checkpoint> ckpt =
      MakeCheckpoint(c, [](std::vector<TensorToWrite>* t) { Remove(t, "lm_head.weight"); });
  ASSERT_NE(ckpt, nullptr);
  EXPECT_THAT(Msg(BindModelWeights(c, *ckpt).status()),
              HasSubstr("missing tensor \"lm_head.weight\" (expected shape [11, 16])"));
}

TEST(ModelWeightsTest, WrongShapeNamesExpectedAndActual) {
  ModelConfig c = SmallQwen2();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c, [](std::vector<TensorToWrite>* t) {
    for (TensorToWrite& w : *t) {
      if (w.name == "model.layers.0.mlp.up_proj.weight") w.shape = {16, 24};  // transposed
    }
  });
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(w.status()), HasSubstr("tensor \"model.layers.0.mlp.up_proj.weight\" has shape "
                                         "[16, 24] but the config needs [24, 16]"));
}

TEST(ModelWeightsTest, NonFloatDtypeIsRejected) {
  ModelConfig c = SmallQwen2();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c, [](std::vector<TensorToWrite>* t) {
    for (TensorToWrite& w : *t) {
      if (w.name == "model.norm.weight") w.dtype = DType::kI16;  // same byte size as BF16
    }
  });
  ASSERT_NE(ckpt, nullptr);
  EXPECT_THAT(Msg(BindModelWeights(c, *ckpt).status()),
              HasSubstr("tensor \"model.norm.weight\" has dtype I16; weights must be F32, F16 "
                        "or BF16"));
}

TEST(ModelWeightsTest, ExtraLayersMeanTheConfigDoesNotMatch) {
  ModelConfig c = SmallQwen2();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c);
  ASSERT_NE(ckpt, nullptr);
  c.num_hidden_layers = 1;
  EXPECT_THAT(Msg(BindModelWeights(c, *ckpt).status()),
              HasSubstr("belongs to layer 1 but the config has num_hidden_layers = 1"));
}

TEST(ModelWeightsTest, ArchitectureFlagsSelectOptionalTensors) {
  ModelConfig c = SmallQwen2();
  c.qkv_bias = false;
  c.qk_norm = true;
  c.o_proj_bias = true;
  c.mlp_bias = true;
  std::vector<std::string> names = RequiredTensorNames(c);
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  EXPECT_TRUE(has("model.layers.1.self_attn.q_norm.weight"));
  EXPECT_TRUE(has("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_TRUE(has("model.layers.0.mlp.down_proj.bias"));
  EXPECT_FALSE(has("model.layers.0.self_attn.q_proj.bias"));
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c);
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers[1].k_norm->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(w->layers[0].gate_bias->shape, (std::vector<int64_t>{24}));
}

// The tiny models transformers saved (testdata/tiny_*): every architecture
// binds, and every tensor's values read back as transformers saw them.
class TransformersModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TransformersModelTest, LoadsAndMatchesTorchValues) {
  const std::string dir = testing::TestDataDir() + "/" + GetParam();
  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const LoadedModel& m = **model;
  EXPECT_EQ(m.weights.layers.size(), static_cast<size_t>(m.config.num_hidden_layers));
  EXPECT_TRUE(m.weights.unused_tensors.empty());
  EXPECT_EQ(m.weights.lm_head_tied, m.config.tie_word_embeddings);

  std::ifstream in(dir + "/tensors.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json stats = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(stats.is_discarded());
  EXPECT_EQ(stats.size(), m.checkpoint->num_tensors());
  for (const auto& [name, s] : stats.items()) {
    const TensorView* t = m.checkpoint->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, s["shape"].get<std::vector<int64_t>>()) << name;
    absl::StatusOr<std::vector<float>> values = ToFloat32(*t);
    ASSERT_TRUE(values.ok()) << values.status();
    double sum = 0;
    for (float v : *values) sum += v;
    // Values are exact (upcasts); the sum differs only by summation order.
    EXPECT_NEAR(sum, s["sum"].get<double>(), 1e-9 * values->size() + 1e-12) << name;
    const std::vector<double> first = s["first"].get<std::vector<double>>();
    for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ((*values)[i], first[i]) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(All, TransformersModelTest,
                         ::testing::Values("tiny_llama", "tiny_qwen2", "tiny_qwen3",
                                           "tiny_mistral"));

}  // namespace
}  // namespace tessera::model
