#include "worker/runner/test_model.h"

#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors_writer.h"

namespace tessera::runner {
namespace {

void AddMoeKeys(const TestModelSpec& s, nlohmann::json* config) {
  nlohmann::json& c = *config;
  c["num_experts_per_tok"] = s.top_k;
  c["moe_intermediate_size"] = s.expert_intermediate;
  c["norm_topk_prob"] = s.norm_topk_prob;
  if (s.architecture == "DeepseekV3ForCausalLM") {
    c["n_routed_experts"] = s.experts;
    c["n_shared_experts"] = s.shared_experts;
    c["n_group"] = s.groups;
    c["topk_group"] = s.topk_groups;
    c["routed_scaling_factor"] = s.routed_scaling;
    c["first_k_dense_replace"] = s.first_dense_layers;
    c["num_key_value_heads"] = s.heads;
    c.erase("head_dim");
    c["q_lora_rank"] = s.q_lora_rank > 0 ? nlohmann::json(s.q_lora_rank) : nlohmann::json();
    c["kv_lora_rank"] = s.kv_lora_rank;
    c["qk_nope_head_dim"] = s.qk_nope_head_dim;
    c["qk_rope_head_dim"] = s.qk_rope_head_dim;
    c["v_head_dim"] = s.v_head_dim;
    c["rope_interleave"] = s.rope_interleave;
    if (s.yarn) {
      c["rope_scaling"] = {
          {"type", "yarn"},       {"factor", 4.0},  {"original_max_position_embeddings", 256},
          {"beta_fast", 32},      {"beta_slow", 1}, {"mscale", 1.0},
          {"mscale_all_dim", 0.5}};
    }
    return;
  }
  if (s.architecture == "Glm4MoeForCausalLM") {
    c["n_routed_experts"] = s.experts;
    c["n_shared_experts"] = s.shared_experts;
    c["n_group"] = s.groups;
    c["topk_group"] = s.topk_groups;
    c["routed_scaling_factor"] = s.routed_scaling;
    c["first_k_dense_replace"] = s.first_dense_layers;
    c["attention_bias"] = true;
    c["use_qk_norm"] = true;
    c["partial_rotary_factor"] = 0.5;
    c["num_nextn_predict_layers"] = 0;
    return;
  }
  c["num_experts"] = s.experts;
  std::vector<int> dense(s.first_dense_layers);
  for (int l = 0; l < s.first_dense_layers; ++l) dense[l] = l;
  c["mlp_only_layers"] = dense;
  c["decoder_sparse_step"] = 1;
}

}  // namespace

absl::Status WriteTestModel(const std::string& dir, const TestModelSpec& s) {
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<model::TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale,
                 float offset) -> absl::Status {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * normal(rng);
    auto t = model::MakeTensor(name, s.dtype, std::move(shape), v);
    if (!t.ok()) return t.status();
    tensors.push_back(std::move(*t));
    return absl::OkStatus();
  };
  const bool mla = s.architecture == "DeepseekV3ForCausalLM";
  const bool glm = s.architecture == "Glm4MoeForCausalLM" || mla;  // grouped routing
  const bool moe = glm || s.architecture == "Qwen3MoeForCausalLM";
  const bool qwen3 = s.architecture == "Qwen3ForCausalLM" || (moe && !mla);
  const bool qwen2 = s.architecture == "Qwen2ForCausalLM" || (glm && !mla);
  // One SwiGLU MLP under `p` (e.g. "model.layers.0.mlp.experts.3.").
  auto swiglu = [&](const std::string& p, int width) {
    absl::Status mlp = add(p + "gate_proj.weight", {width, s.hidden}, s.weight_scale, 0);
    mlp.Update(add(p + "up_proj.weight", {width, s.hidden}, s.weight_scale, 0));
    mlp.Update(add(p + "down_proj.weight", {s.hidden, width}, s.weight_scale, 0));
    return mlp;
  };
  // The router, experts and shared experts of a sparse layer.
  auto moe_block = [&](const std::string& p) {
    absl::Status block = add(p + "mlp.gate.weight", {s.experts, s.hidden}, s.weight_scale, 0);
    if (glm) block.Update(add(p + "mlp.gate.e_score_correction_bias", {s.experts}, 0.05f, 0));
    for (int e = 0; e < s.experts; ++e) {
      block.Update(swiglu(absl::StrCat(p, "mlp.experts.", e, "."), s.expert_intermediate));
    }
    if (glm && s.shared_experts > 0) {
      block.Update(swiglu(p + "mlp.shared_experts.", s.expert_intermediate * s.shared_experts));
    }
    return block;
  };
  const int q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  absl::Status st = add("model.embed_tokens.weight", {s.vocab, s.hidden}, 1.0f, 0.0f);
  for (int l = 0; l < s.layers && st.ok(); ++l) {
    std::string p = absl::StrCat("model.layers.", l, ".");
    st.Update(add(p + "input_layernorm.weight", {s.hidden}, 0.2f, 1.0f));
    st.Update(add(p + "post_attention_layernorm.weight", {s.hidden}, 0.2f, 1.0f));
    if (mla) {
      const int qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
      const std::string a = p + "self_attn.";
      if (s.q_lora_rank > 0) {
        st.Update(add(a + "q_a_proj.weight", {s.q_lora_rank, s.hidden}, s.weight_scale, 0));
        st.Update(add(a + "q_a_layernorm.weight", {s.q_lora_rank}, 0.2f, 1.0f));
        st.Update(add(a + "q_b_proj.weight", {s.heads * qk, s.q_lora_rank}, s.weight_scale, 0));
      } else {
        st.Update(add(a + "q_proj.weight", {s.heads * qk, s.hidden}, s.weight_scale, 0));
      }
      st.Update(add(a + "kv_a_proj_with_mqa.weight",
                    {s.kv_lora_rank + s.qk_rope_head_dim, s.hidden}, s.weight_scale, 0));
      st.Update(add(a + "kv_a_layernorm.weight", {s.kv_lora_rank}, 0.2f, 1.0f));
      st.Update(add(a + "kv_b_proj.weight",
                    {s.heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank}, s.weight_scale,
                    0));
      st.Update(add(a + "o_proj.weight", {s.hidden, s.heads * s.v_head_dim}, s.weight_scale, 0));
    } else {
      st.Update(add(p + "self_attn.q_proj.weight", {q, s.hidden}, s.weight_scale, 0));
      st.Update(add(p + "self_attn.k_proj.weight", {kv, s.hidden}, s.weight_scale, 0));
      st.Update(add(p + "self_attn.v_proj.weight", {kv, s.hidden}, s.weight_scale, 0));
      st.Update(add(p + "self_attn.o_proj.weight", {s.hidden, q}, s.weight_scale, 0));
    }
    if (qwen2) {
      st.Update(add(p + "self_attn.q_proj.bias", {q}, 0.1f, 0));
      st.Update(add(p + "self_attn.k_proj.bias", {kv}, 0.1f, 0));
      st.Update(add(p + "self_attn.v_proj.bias", {kv}, 0.1f, 0));
    }
    if (qwen3) {
      st.Update(add(p + "self_attn.q_norm.weight", {s.head_dim}, 0.2f, 1.0f));
      st.Update(add(p + "self_attn.k_norm.weight", {s.head_dim}, 0.2f, 1.0f));
    }
    if (moe && l >= s.first_dense_layers) {
      st.Update(moe_block(p));
      continue;
    }
    st.Update(add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, s.weight_scale, 0));
    st.Update(add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, s.weight_scale, 0));
    st.Update(add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, s.weight_scale, 0));
  }
  st.Update(add("model.norm.weight", {s.hidden}, 0.2f, 1.0f));
  if (!s.tie_embeddings) st.Update(add("lm_head.weight", {s.vocab, s.hidden}, s.weight_scale, 0));
  if (!st.ok()) return st;
  if (s.edit_tensors) s.edit_tensors(&tensors);
  if (auto w = model::WriteSafetensorsFile(dir + "/model.safetensors", tensors); !w.ok()) return w;

  nlohmann::json config = {
      {"architectures", {s.architecture}},
      {"vocab_size", s.vocab},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.intermediate},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"max_position_embeddings", s.max_positions},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", s.tie_embeddings},
      {"hidden_act", "silu"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  if (moe) AddMoeKeys(s, &config);
  std::ofstream out(dir + "/config.json");
  out << config.dump(1);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", dir, "/config.json"));
  return absl::OkStatus();
}

}  // namespace tessera::runner
