// The config.json of a Qwen3-8B-shaped model (36 layers, hidden 4096, 32
// heads / 8 KV heads of 128 with per-head q/k RMSNorm, MLP 12288, vocabulary
// 151936) for the GPU benchmarks, which give it random bf16 weights: speed
// does not depend on their values.
#pragma once

namespace tessera {

inline constexpr char kQwen3_8BConfig[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
  "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
  "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645
})";

}  // namespace tessera
