// MlaConfig: the multi-head latent attention (MLA) part of a DeepSeek-V3 /
// Kimi K2 config.json (DeepseekV3ForCausalLM), as transformers reads it.
//
// Per layer and token, with H = hidden_size, n = num_attention_heads,
// dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim,
// r = kv_lora_rank, rq = q_lora_rank:
//   q      = q_b_proj(RMSNorm(q_a_proj(x)))   [n, dn + dr]   (rq > 0)
//          = q_proj(x)                         [n, dn + dr]   (rq = 0)
//   [c, k_pe] = kv_a_proj_with_mqa(x)          [r + dr]
//   c      = kv_a_layernorm(c)                 the latent (cached)
//   k_pe   = RoPE(k_pe)                        one head shared by all (cached)
//   [k_nope_h, v_h] = kv_b_proj(c) rows of head h   [dn], [dv]
//   score  = softmax_scale * (q_nope . k_nope + RoPE(q_pe) . k_pe)
// The RMSNorms of q_a and kv_a use eps 1e-6 (transformers' default; the
// config's rms_norm_eps is for the hidden-size norms). RoPE rotates only the
// dr dims; with rope_interleave (transformers' default, and DeepSeek's
// original code) the pairs are (x[2i], x[2i+1]), else rotate_half.
// YaRN scales cos and sin by rope_attention_factor, and, when
// mscale_all_dim is set, the softmax scale by mscale(factor,
// mscale_all_dim)^2 (transformers' DeepseekV3Attention).
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>

namespace tessera::model {

inline constexpr double kMlaNormEps = 1e-6;

struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: a plain q_proj (config's q_lora_rank null)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;
  double softmax_scale = 0;          // qk_head_dim^-0.5, x mscale^2 under YaRN
  double rope_attention_factor = 1;  // multiplies cos and sin (YaRN)

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values one token stores per layer in the latent KV cache: c then k_pe.
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  // Rows of kv_b_proj per head: k_nope (dn) then v (dv).
  int64_t kv_b_rows_per_head() const { return qk_nope_head_dim + v_head_dim; }
};

}  // namespace tessera::model
