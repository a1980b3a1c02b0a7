#include "worker/model/deepseek_v3_config.h"

#include <cmath>
#include <string>

#include "base/json.h"
#include "base/str_cat.h"
#include "worker/model/rope.h"

namespace tessera::model {
namespace {

using Json = nlohmann::json;

const Json* Lookup(const Json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// An optional integer in [min, max]; keeps *out when absent or null.
absl::Status Int(const Json& obj, std::string_view key, int64_t min, int64_t max, int64_t* out) {
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number_integer()) {
    return absl::InvalidArgumentError(
        Cat(key, " must be an integer, got ", JsonTypeName(*v), " ", v->dump().substr(0, 48)));
  }
  if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(max)
                              : v->get<int64_t>() > max) {
    return absl::InvalidArgumentError(
        Cat(key, " = ", v->dump(), " exceeds the limit of ", max, " (corrupt config?)"));
  }
  const int64_t value = v->get<int64_t>();  // <= max, so representable
  if (value < min) return absl::InvalidArgumentError(Cat(key, " = ", value, " must be >= ", min));
  *out = value;
  return absl::OkStatus();
}

// A string key that, when given, must equal `want`.
absl::Status OnlyString(const Json& obj, std::string_view key, std::string_view want,
                        std::string_view why) {
  const Json* v = Lookup(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) {
    return absl::InvalidArgumentError(Cat(key, " must be a string, got ", JsonTypeName(*v)));
  }
  if (v->get<std::string>() != want) {
    return absl::InvalidArgumentError(Cat(key, " \"", v->get<std::string>(),
                                          "\" is not supported for DeepseekV3ForCausalLM (only \"",
                                          want, "\": ", why, ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseMlaDims(const Json& obj, MlaConfig* m) {
  m->q_lora_rank = 1536;
  if (const auto it = obj.find("q_lora_rank"); it != obj.end() && it->is_null()) {
    m->q_lora_rank = 0;  // null: a plain q_proj
  } else if (absl::Status s = Int(obj, "q_lora_rank", 1, kMaxHiddenSize, &m->q_lora_rank);
             !s.ok()) {
    return s;
  }
  m->kv_lora_rank = 512;
  m->qk_nope_head_dim = 128;
  m->qk_rope_head_dim = 64;
  m->v_head_dim = 128;
  for (auto [key, out] : {std::pair{"kv_lora_rank", &m->kv_lora_rank},
                          std::pair{"qk_nope_head_dim", &m->qk_nope_head_dim},
                          std::pair{"qk_rope_head_dim", &m->qk_rope_head_dim},
                          std::pair{"v_head_dim", &m->v_head_dim}}) {
    const int64_t min = std::string_view(key) == "qk_nope_head_dim" ? 0 : 1;
    if (absl::Status s = Int(obj, key, min, kMaxHeadDim, out); !s.ok()) return s;
  }
  if (m->qk_rope_head_dim < 2 || m->qk_rope_head_dim % 2 != 0) {
    return absl::InvalidArgumentError(Cat("qk_rope_head_dim = ", m->qk_rope_head_dim,
                                          " must be even and >= 2 for rotary embeddings"));
  }
  if (const Json* v = Lookup(obj, "rope_interleave")) {
    if (!v->is_boolean()) {
      return absl::InvalidArgumentError(
          Cat("rope_interleave must be true or false, got ", JsonTypeName(*v)));
    }
    m->rope_interleave = v->get<bool>();
  }
  return absl::OkStatus();
}

// transformers' DeepseekV3Attention: qk_head_dim^-0.5, times
// yarn_get_mscale(factor, mscale_all_dim)^2 when RoPE is scaled and
// mscale_all_dim is set (non-zero).
double SoftmaxScale(const MlaConfig& m, const RopeScaling& rope) {
  double scale = 1.0 / std::sqrt(static_cast<double>(m.qk_head_dim()));
  if (rope.type == RopeScalingType::kYarn && rope.mscale_all_dim != 0) {
    const double mscale = YarnMscale(rope.factor, rope.mscale_all_dim);
    scale *= mscale * mscale;
  }
  return scale;
}

}  // namespace

absl::Status ParseDeepseekV3Extras(const Json& obj, ModelConfig* c) {
  if (const Json* bias = Lookup(obj, "attention_bias"); bias && *bias == true) {
    return absl::InvalidArgumentError(
        "attention_bias = true is not supported for DeepseekV3ForCausalLM (no released "
        "checkpoint has q_a/kv_a/o_proj biases)");
  }
  if (absl::Status s = OnlyString(obj, "topk_method", "noaux_tc",
                                  "group-limited top-k with the correction bias");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = OnlyString(obj, "scoring_func", "sigmoid", "sigmoid router scores");
      !s.ok()) {
    return s;
  }
  int64_t moe_layer_freq = 1;
  if (absl::Status s = Int(obj, "moe_layer_freq", 1, kMaxLayers, &moe_layer_freq); !s.ok()) {
    return s;
  }
  if (moe_layer_freq != 1) {
    return absl::InvalidArgumentError(
        Cat("moe_layer_freq = ", moe_layer_freq,
            " is not supported (only 1: transformers ignores the key while DeepSeek's code "
            "skips layers by it, so the two disagree on which layers are sparse)"));
  }
  if (c->num_key_value_heads != c->num_attention_heads) {
    return absl::InvalidArgumentError(
        Cat("num_key_value_heads = ", c->num_key_value_heads,
            " must equal num_attention_heads = ", c->num_attention_heads,
            " for multi-head latent attention (every head has its own keys and values)"));
  }
  RopeScaling& rope = c->rope_scaling;
  if (rope.type != RopeScalingType::kNone && rope.type != RopeScalingType::kYarn) {
    return absl::InvalidArgumentError(
        "DeepseekV3ForCausalLM supports the rope types default and yarn only");
  }
  if (rope.type == RopeScalingType::kYarn && rope.original_max_position_embeddings == 0) {
    rope.original_max_position_embeddings = c->max_position_embeddings;
  }
  MlaConfig m;
  if (absl::Status s = ParseMlaDims(obj, &m); !s.ok()) return s;
  m.softmax_scale = SoftmaxScale(m, rope);
  m.rope_attention_factor = RopeAttentionFactor(rope);
  // transformers sets head_dim = qk_rope_head_dim: the RoPE table's width.
  c->head_dim = m.qk_rope_head_dim;
  c->partial_rotary_factor = 1.0;
  c->mla = m;
  return absl::OkStatus();
}

}  // namespace tessera::model
