// Binding mixture-of-experts checkpoints: the per-expert tensors of the
// fixtures transformers saved, the errors for missing or misshapen tensors,
// and GLM-4.5's multi-token-prediction layers, which are skipped.
#include <cstdlib>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/test_util.h"
#include "worker/model/weights.h"

namespace tessera::model {
namespace {

using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::string FixtureDir(const std::string& name) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/fixtures/models/" + name;
}

// A small GLM-4.5-style config: 8 experts in 4 groups, one shared expert,
// layer 0 dense, one MTP layer.
ModelConfig SmallGlm() {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({"architectures": ["Glm4MoeForCausalLM"],
      "vocab_size": 11, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
      "attention_bias": true, "moe_intermediate_size": 6, "n_routed_experts": 8,
      "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2, "n_shared_experts": 2,
      "first_k_dense_replace": 1, "num_nextn_predict_layers": 1})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Writes every required tensor of `c` (F32, small values), then `edit`.
std::unique_ptr<Checkpoint> MakeCheckpoint(
    const ModelConfig& c, const std::function<void(std::vector<TensorToWrite>*)>& edit = {}) {
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : RequiredTensors(c)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<float> values(static_cast<size_t>(n), 0.25f);
    tensors.push_back(*MakeTensor(spec.name, DType::kF32, spec.shape, values));
  }
  if (edit) edit(&tensors);
  const std::string path = testing::MakeTempDir() + "/model.safetensors";
  EXPECT_TRUE(WriteSafetensorsFile(path, tensors).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(path);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  return ckpt.ok() ? *std::move(ckpt) : nullptr;
}

TensorToWrite Tensor(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return *MakeTensor(name, DType::kF32, std::move(shape), std::vector<float>(n, 1.0f));
}

TEST(MoeWeightsTest, FixturesBindEveryExpertOfTheSparseLayers) {
  for (const char* name : {"qwen3_moe_tiny", "glm4_moe_tiny"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<LoadedModel>> m = LoadModel(FixtureDir(name));
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = (*m)->config;
    const ModelWeights& w = (*m)->weights;
    EXPECT_TRUE(w.unused_tensors.empty());
    EXPECT_TRUE(w.skipped_tensors.empty());
    const bool glm = c.architecture == ModelArchitecture::kGlm4Moe;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      ASSERT_EQ(lw.moe.has_value(), c.IsSparseLayer(l)) << l;
      if (!lw.moe) {
        EXPECT_EQ(lw.gate_proj.shape, (std::vector<int64_t>{160, 64}));
        continue;
      }
      EXPECT_TRUE(lw.gate_proj.shape.empty()) << "a sparse layer has no dense MLP";
      const int64_t E = glm ? 16 : 8;
      EXPECT_EQ(lw.moe->router.shape, (std::vector<int64_t>{E, 64}));
      ASSERT_EQ(lw.moe->experts.size(), static_cast<size_t>(E));
      EXPECT_EQ(lw.moe->experts[E - 1].up_proj.name, "model.layers." + std::to_string(l) +
                                                         ".mlp.experts." + std::to_string(E - 1) +
                                                         ".up_proj.weight");
      EXPECT_EQ(lw.moe->experts[3].down_proj.shape, (std::vector<int64_t>{64, 32}));
      EXPECT_EQ(lw.moe->correction_bias.has_value(), glm);
      EXPECT_EQ(lw.moe->shared.has_value(), glm);
      if (glm) {
        EXPECT_EQ(lw.moe->shared->gate_proj.shape, (std::vector<int64_t>{32, 64}));
      }
    }
  }
}

TEST(MoeWeightsTest, SharedExpertsAreOneMlpOfTheirCombinedWidth) {
  const ModelConfig c = SmallGlm();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c);
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE(w->layers[0].moe.has_value());
  ASSERT_TRUE(w->layers[1].moe.has_value());
  EXPECT_EQ(w->layers[1].moe->shared->down_proj.shape, (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(w->layers[1].moe->correction_bias->shape, (std::vector<int64_t>{8}));
  EXPECT_TRUE(w->layers[1].q_bias.has_value());
  EXPECT_FALSE(w->layers[1].o_bias.has_value());
}

TEST(MoeWeightsTest, MultiTokenPredictionLayersAreSkippedNotAnError) {
  const ModelConfig c = SmallGlm();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c, [](std::vector<TensorToWrite>* t) {
    // GLM-4.5's MTP module, stored as layer num_hidden_layers.
    t->push_back(Tensor("model.layers.2.eh_proj.weight", {16, 32}));
    t->push_back(Tensor("model.layers.2.enorm.weight", {16}));
    t->push_back(Tensor("model.layers.2.mlp.experts.0.up_proj.weight", {6, 16}));
  });
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->skipped_tensors, (std::vector<std::string>{
                                    "model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight",
                                    "model.layers.2.mlp.experts.0.up_proj.weight"}));
  EXPECT_TRUE(w->unused_tensors.empty());

  // A layer past the MTP layers still means the config does not match.
  ckpt = MakeCheckpoint(c, [](std::vector<TensorToWrite>* t) {
    t->push_back(Tensor("model.layers.3.enorm.weight", {16}));
  });
  ASSERT_NE(ckpt, nullptr);
  EXPECT_THAT(
      Msg(BindModelWeights(c, *ckpt).status()),
      HasSubstr("\"model.layers.3.enorm.weight\" belongs to layer 3 but the config has "
                "num_hidden_layers = 2 (and 1 multi-token-prediction layer(s) after them)"));
}

// The fused [E, 2J, H] / [E, H, J] layout binds too: each expert's views
// are its slabs, gate rows first.
TEST(MoeWeightsTest, FusedExpertTensorsBindAsPerExpertViews) {
  const ModelConfig c = SmallGlm();
  const int64_t E = 8, J = 6, H = 16;
  std::vector<float> gate_up(E * 2 * J * H), down(E * H * J);
  std::iota(gate_up.begin(), gate_up.end(), 0.0f);
  std::iota(down.begin(), down.end(), 0.0f);
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c, [&](std::vector<TensorToWrite>* t) {
    std::erase_if(*t, [](const TensorToWrite& w) {
      return w.name.starts_with("model.layers.1.mlp.experts.");
    });
    t->push_back(*MakeTensor("model.layers.1.mlp.experts.gate_up_proj", DType::kF32, {E, 2 * J, H},
                             gate_up));
    t->push_back(*MakeTensor("model.layers.1.mlp.experts.down_proj", DType::kF32, {E, H, J}, down));
  });
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->unused_tensors.empty());
  const ExpertWeights& e3 = w->layers[1].moe->experts[3];
  EXPECT_EQ(e3.gate_proj.shape, (std::vector<int64_t>{J, H}));
  EXPECT_EQ(e3.up_proj.shape, (std::vector<int64_t>{J, H}));
  EXPECT_EQ(e3.down_proj.shape, (std::vector<int64_t>{H, J}));
  auto first = [](const TensorView& v) { return (*ToFloat32(v))[0]; };
  EXPECT_EQ(first(e3.gate_proj), static_cast<float>(3 * 2 * J * H));
  EXPECT_EQ(first(e3.up_proj), static_cast<float>(3 * 2 * J * H + J * H));
  EXPECT_EQ(first(e3.down_proj), static_cast<float>(3 * H * J));
  EXPECT_EQ(ToFloat32(e3.up_proj)->back(), static_cast<float>(4 * 2 * J * H - 1));

  // A fused tensor of the wrong shape is an error naming it.
  ckpt = MakeCheckpoint(c, [&](std::vector<TensorToWrite>* t) {
    std::erase_if(*t, [](const TensorToWrite& w) {
      return w.name.starts_with("model.layers.1.mlp.experts.");
    });
    t->push_back(*MakeTensor("model.layers.1.mlp.experts.gate_up_proj", DType::kF32, {E, 2 * J, H},
                             gate_up));
    t->push_back(*MakeTensor("model.layers.1.mlp.experts.down_proj", DType::kF32, {E, J, H}, down));
  });
  ASSERT_NE(ckpt, nullptr);
  EXPECT_THAT(Msg(BindModelWeights(c, *ckpt).status()),
              HasSubstr("tensor \"model.layers.1.mlp.experts.down_proj\" has shape [8, 6, 16] but "
                        "the config needs [8, 16, 6]"));
}

struct BrokenTensor {
  std::string name;
  std::string tensor;
  std::vector<int64_t> shape;  // empty: remove the tensor
  absl::StatusCode code;
  std::string message;
};

class BrokenMoeCheckpointTest : public ::testing::TestWithParam<BrokenTensor> {};

TEST_P(BrokenMoeCheckpointTest, IsAnErrorNamingTheTensor) {
  const BrokenTensor& p = GetParam();
  const ModelConfig c = SmallGlm();
  std::unique_ptr<Checkpoint> ckpt = MakeCheckpoint(c, [&](std::vector<TensorToWrite>* t) {
    std::erase_if(*t, [&](const TensorToWrite& w) { return w.name == p.tensor; });
    if (!p.shape.empty()) t->push_back(Tensor(p.tensor, p.shape));
  });
  ASSERT_NE(ckpt, nullptr);
  absl::StatusOr<ModelWeights> w = BindModelWeights(c, *ckpt);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), p.code);
  EXPECT_THAT(Msg(w.status()), HasSubstr(p.message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BrokenMoeCheckpointTest,
    ::testing::Values(
        BrokenTensor{"MissingExpert",
                     "model.layers.1.mlp.experts.5.up_proj.weight",
                     {},
                     absl::StatusCode::kNotFound,
                     "missing tensor \"model.layers.1.mlp.experts.5.up_proj.weight\" (expected "
                     "shape [6, 16])"},
        BrokenTensor{"MissingRouter",
                     "model.layers.1.mlp.gate.weight",
                     {},
                     absl::StatusCode::kNotFound,
                     "missing tensor \"model.layers.1.mlp.gate.weight\" (expected shape [8, 16])"},
        BrokenTensor{"MissingCorrectionBias",
                     "model.layers.1.mlp.gate.e_score_correction_bias",
                     {},
                     absl::StatusCode::kNotFound,
                     "missing tensor \"model.layers.1.mlp.gate.e_score_correction_bias\""},
        BrokenTensor{"MissingSharedExpert",
                     "model.layers.1.mlp.shared_experts.down_proj.weight",
                     {},
                     absl::StatusCode::kNotFound,
                     "missing tensor \"model.layers.1.mlp.shared_experts.down_proj.weight\" "
                     "(expected shape [16, 12])"},
        BrokenTensor{"RouterTransposed",
                     "model.layers.1.mlp.gate.weight",
                     {16, 8},
                     absl::StatusCode::kInvalidArgument,
                     "tensor \"model.layers.1.mlp.gate.weight\" has shape [16, 8] but the config "
                     "needs [8, 16]"},
        BrokenTensor{"ExpertTooWide",
                     "model.layers.1.mlp.experts.7.down_proj.weight",
                     {16, 24},
                     absl::StatusCode::kInvalidArgument,
                     "tensor \"model.layers.1.mlp.experts.7.down_proj.weight\" has shape [16, 24] "
                     "but the config needs [16, 6]"},
        BrokenTensor{"SharedExpertOfOneExpertsWidth",
                     "model.layers.1.mlp.shared_experts.gate_proj.weight",
                     {6, 16},
                     absl::StatusCode::kInvalidArgument,
                     "has shape [6, 16] but the config needs [12, 16]"},
        BrokenTensor{"DenseLayerMissingItsMlp",
                     "model.layers.0.mlp.down_proj.weight",
                     {},
                     absl::StatusCode::kNotFound,
                     "missing tensor \"model.layers.0.mlp.down_proj.weight\""}),
    [](const ::testing::TestParamInfo<BrokenTensor>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera::model
