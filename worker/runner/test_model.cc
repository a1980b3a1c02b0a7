#include "worker/runner/test_model.h"

#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors_writer.h"

namespace tessera::runner {

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
  const bool qwen3 = s.architecture == "Qwen3ForCausalLM";
  const bool qwen2 = s.architecture == "Qwen2ForCausalLM";
  const int q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  absl::Status st = add("model.embed_tokens.weight", {s.vocab, s.hidden}, 1.0f, 0.0f);
  for (int l = 0; l < s.layers && st.ok(); ++l) {
    std::string p = absl::StrCat("model.layers.", l, ".");
    st.Update(add(p + "input_layernorm.weight", {s.hidden}, 0.2f, 1.0f));
    st.Update(add(p + "post_attention_layernorm.weight", {s.hidden}, 0.2f, 1.0f));
    st.Update(add(p + "self_attn.q_proj.weight", {q, s.hidden}, s.weight_scale, 0));
    st.Update(add(p + "self_attn.k_proj.weight", {kv, s.hidden}, s.weight_scale, 0));
    st.Update(add(p + "self_attn.v_proj.weight", {kv, s.hidden}, s.weight_scale, 0));
    st.Update(add(p + "self_attn.o_proj.weight", {s.hidden, q}, s.weight_scale, 0));
    if (qwen2) {
      st.Update(add(p + "self_attn.q_proj.bias", {q}, 0.1f, 0));
      st.Update(add(p + "self_attn.k_proj.bias", {kv}, 0.1f, 0));
      st.Update(add(p + "self_attn.v_proj.bias", {kv}, 0.1f, 0));
    }
    if (qwen3) {
      st.Update(add(p + "self_attn.q_norm.weight", {s.head_dim}, 0.2f, 1.0f));
      st.Update(add(p + "self_attn.k_norm.weight", {s.head_dim}, 0.2f, 1.0f));
    }
    st.Update(add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, s.weight_scale, 0));
    st.Update(add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, s.weight_scale, 0));
    st.Update(add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, s.weight_scale, 0));
  }
  st.Update(add("model.norm.weight", {s.hidden}, 0.2f, 1.0f));
  if (!s.tie_embeddings) st.Update(add("lm_head.weight", {s.vocab, s.hidden}, s.weight_scale, 0));
  if (!st.ok()) return st;
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
  std::ofstream out(dir + "/config.json");
  out << config.dump(1);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", dir, "/config.json"));
  return absl::OkStatus();
}

}  // namespace tessera::runner
