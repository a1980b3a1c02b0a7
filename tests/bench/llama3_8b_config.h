// The config.json of a Llama-3-8B-shaped model (Meta-Llama-3.1-8B's shapes:
// 32 layers, hidden 4096, 32 heads / 8 KV heads of 128, MLP 14336, vocabulary
// 128256, llama3 RoPE scaling) for the GPU benchmarks, which give it random
// bf16 weights: speed does not depend on their values.
#pragma once

namespace tessera {

inline constexpr char kLlama3_8BConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
  "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
  "bos_token_id": 128000, "eos_token_id": 128001
})";

}  // namespace tessera
