// The DeepseekV3ForCausalLM part of config.json parsing (DeepSeek-V3/R1 and
// Kimi K2, model_type "deepseek_v3" or "kimi_k2"): the multi-head latent
// attention keys (mla_config.h), the routing keys that only DeepSeek's
// original code reads (topk_method, scoring_func, moe_layer_freq) and the
// RoPE checks. config.cc parses the common keys and the MoE keys, then calls
// this.
//
// Keys (defaults as transformers' DeepseekV3Config): q_lora_rank (1536; null
// = plain q_proj), kv_lora_rank (512), qk_nope_head_dim (128),
// qk_rope_head_dim (64, even), v_head_dim (128), rope_interleave (true).
// head_dim is set to qk_rope_head_dim, as transformers does (the RoPE table
// is that wide); num_key_value_heads must equal num_attention_heads.
// Refused (INVALID_ARGUMENT naming the key): attention_bias true (no
// released checkpoint has it); topk_method other than "noaux_tc";
// scoring_func other than "sigmoid"; moe_layer_freq other than 1
// (transformers ignores it, DeepSeek's code does not, so the two disagree);
// rope types other than default and yarn.
//
// Thread-safety: pure functions.
#pragma once

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"

namespace tessera::model {

// Fills config->mla (and head_dim) from `obj`, after the common keys,
// rope_scaling and the MoE keys are in *config.
absl::Status ParseDeepseekV3Extras(const nlohmann::json& obj, ModelConfig* config);

}  // namespace tessera::model
