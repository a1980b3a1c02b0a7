// The config.json of a Qwen3-30B-A3B-shaped mixture-of-experts model (48
// layers, hidden 2048, 32 heads / 4 KV heads of 128 with per-head q/k
// RMSNorm, 128 experts of width 768, top-8 with renormalised weights, every
// layer sparse, vocabulary 151936) for the GPU benchmarks, which give it
// random bf16 weights: speed does not depend on their values (the routing
// does, and random routers spread tokens roughly uniformly).
#pragma once

namespace tessera {

inline constexpr char kQwen3_30BA3BConfig[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645,
  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []
})";

}  // namespace tessera
