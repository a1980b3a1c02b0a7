// The multi-head latent attention tensors of DeepseekV3ForCausalLM
// checkpoints: the exact names transformers' DeepseekV3Attention saves
// (q_a_proj, q_a_layernorm, q_b_proj or q_proj; kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj; o_proj) and the MoE names (mlp.gate.weight,
// e_score_correction_bias, experts, shared_experts), their shapes, the
// errors for missing or misshapen ones, and the multi-token-prediction
// layer skipped.
#include <algorithm>
#include <functional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/checkpoint.h"
#include "worker/model/config.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/test_util.h"
#include "worker/model/weights.h"

namespace tessera::model {
namespace {

using ::testing::HasSubstr;

ModelConfig SmallDeepseek(bool q_lora) {
  const std::string q = q_lora ? "12" : "null";
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 11, "hidden_size": 16,
      "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 2, "q_lora_rank": )" +
      q + R"(, "kv_lora_rank": 8, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4,
      "v_head_dim": 5, "moe_intermediate_size": 6, "n_routed_experts": 4,
      "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "n_shared_experts": 1,
      "first_k_dense_replace": 1, "num_nextn_predict_layers": 1})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::unique_ptr<Checkpoint> MakeCheckpoint(
    const ModelConfig& c, const std::function<void(std::vector<TensorToWrite>*)>& edit = {}) {
  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : RequiredTensors(c)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    tensors.push_back(*MakeTensor(spec.name, DType::kF32, spec.shape,
                                  std::vector<float>(static_cast<size_t>(n), 0.25f)));
  }
  if (edit) edit(&tensors);
  const std::string path = testing::MakeTempDir() + "/model.safetensors";
  EXPECT_TRUE(WriteSafetensorsFile(path, tensors).ok());
  auto ckpt = Checkpoint::Open(path);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  return ckpt.ok() ? *std::move(ckpt) : nullptr;
}

std::vector<TensorSpec> LayerSpecs(const ModelConfig& c, int layer) {
  std::vector<TensorSpec> out;
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  for (TensorSpec& t : RequiredTensors(c)) {
    if (t.name.starts_with(prefix) && t.name.find(".experts.") == std::string::npos) {
      t.name = t.name.substr(prefix.size());
      out.push_back(std::move(t));
    }
  }
  return out;
}

MATCHER_P2(Spec, name, shape, "") { return arg.name == name && arg.shape == shape; }

TEST(MlaWeightsTest, TheRealTensorNamesAndShapes) {
  using V = std::vector<int64_t>;
  // heads 2, dn 6, dr 4, dv 5, r 8, rq 12, H 16.
  EXPECT_THAT(
      LayerSpecs(SmallDeepseek(true), 1),
      ::testing::ElementsAre(
          Spec("input_layernorm.weight", V{16}), Spec("self_attn.q_a_proj.weight", V{12, 16}),
          Spec("self_attn.q_a_layernorm.weight", V{12}),
          Spec("self_attn.q_b_proj.weight", V{20, 12}),
          Spec("self_attn.kv_a_proj_with_mqa.weight", V{12, 16}),
          Spec("self_attn.kv_a_layernorm.weight", V{8}),
          Spec("self_attn.kv_b_proj.weight", V{22, 8}), Spec("self_attn.o_proj.weight", V{16, 10}),
          Spec("post_attention_layernorm.weight", V{16}), Spec("mlp.gate.weight", V{4, 16}),
          Spec("mlp.gate.e_score_correction_bias", V{4}),
          Spec("mlp.shared_experts.gate_proj.weight", V{6, 16}),
          Spec("mlp.shared_experts.up_proj.weight", V{6, 16}),
          Spec("mlp.shared_experts.down_proj.weight", V{16, 6})));
  const std::vector<TensorSpec> plain = LayerSpecs(SmallDeepseek(false), 0);
  EXPECT_THAT(plain[1], Spec("self_attn.q_proj.weight", V{20, 16}));
  EXPECT_THAT(plain.back(), Spec("mlp.down_proj.weight", V{16, 24}));  // layer 0 dense
}

TEST(MlaWeightsTest, BindsBothQueryLayoutsAndSkipsTheMtpLayer) {
  for (bool q_lora : {true, false}) {
    SCOPED_TRACE(q_lora);
    const ModelConfig c = SmallDeepseek(q_lora);
    auto ckpt = MakeCheckpoint(c, [](std::vector<TensorToWrite>* t) {
      t->push_back(*MakeTensor("model.layers.2.eh_proj.weight", DType::kF32, {16, 32},
                               std::vector<float>(512, 0.0f)));
    });
    ASSERT_NE(ckpt, nullptr);
    auto w = BindModelWeights(c, *ckpt);
    ASSERT_TRUE(w.ok()) << w.status();
    const LayerWeights& l = w->layers[1];
    ASSERT_TRUE(l.mla.has_value());
    EXPECT_EQ(l.mla->q_a_proj.has_value(), q_lora);
    EXPECT_EQ(l.mla->q_proj.has_value(), !q_lora);
    EXPECT_EQ(l.mla->kv_b_proj.shape, (std::vector<int64_t>{22, 8}));
    EXPECT_EQ(l.o_proj.shape, (std::vector<int64_t>{16, 10}));
    ASSERT_TRUE(l.moe.has_value());
    EXPECT_TRUE(l.moe->correction_bias.has_value());
    EXPECT_TRUE(l.moe->shared.has_value());
    EXPECT_THAT(w->skipped_tensors, ::testing::ElementsAre("model.layers.2.eh_proj.weight"));
    EXPECT_TRUE(w->unused_tensors.empty());
  }
}

TEST(MlaWeightsTest, MissingOrMisshapenTensorsAreNamed) {
  const ModelConfig c = SmallDeepseek(true);
  auto erase = [](const std::string& name) {
    return [name](std::vector<TensorToWrite>* t) {
      t->erase(std::remove_if(t->begin(), t->end(),
                              [&](const TensorToWrite& x) { return x.name == name; }),
               t->end());
    };
  };
  auto missing = MakeCheckpoint(c, erase("model.layers.0.self_attn.kv_b_proj.weight"));
  auto w = BindModelWeights(c, *missing);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("missing tensor \"model.layers.0.self_attn.kv_b_proj.weight\" (expected "
                        "shape [22, 8])"));
  auto wrong = MakeCheckpoint(c, [&](std::vector<TensorToWrite>* t) {
    erase("model.layers.1.self_attn.kv_a_proj_with_mqa.weight")(t);
    t->push_back(*MakeTensor("model.layers.1.self_attn.kv_a_proj_with_mqa.weight", DType::kF32,
                             {8, 16}, std::vector<float>(128, 0.0f)));
  });
  w = BindModelWeights(c, *wrong);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("\"model.layers.1.self_attn.kv_a_proj_with_mqa.weight\" has shape [8, "
                        "16] but the config needs [12, 16]"));
}

}  // namespace
}  // namespace tessera::model
