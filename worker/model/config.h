// ModelConfig: the parts of a Hugging Face `config.json` the runtime needs,
// parsed and validated, for the decoder-only architectures Tessera runs:
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.
//
// All four are pre-norm decoders: RMSNorm -> attention (GQA, RoPE) -> residual
// -> RMSNorm -> SwiGLU MLP (silu(gate) * up -> down) -> residual; final RMSNorm
// and an lm_head (tied to the embedding when tie_word_embeddings). They differ
// only in the flags below:
//   Llama:   q/k/v/o bias = attention_bias; gate/up/down bias = mlp_bias;
//            rope_scaling may be "linear" or "llama3".
//   Mistral: no biases; sliding_window (int or null) applies to every layer.
//   Qwen2:   q/k/v bias always, no o bias; sliding window only when
//            use_sliding_window, for layers >= max_window_layers.
//   Qwen3:   per-head RMSNorm of q and k (q_norm/k_norm, weight [head_dim])
//            after the projection and before RoPE; q/k/v/o bias =
//            attention_bias; head_dim is given explicitly and may differ from
//            hidden_size / num_attention_heads.
//
// Keys and defaults. Required: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, and "architectures" or
// "model_type". Optional, with transformers' defaults: num_key_value_heads
// (= heads), head_dim (= hidden / heads; null means absent), rms_norm_eps
// (1e-6), rope_theta (10000), rope_scaling (null), max_position_embeddings
// (per architecture, as transformers), tie_word_embeddings (false),
// attention_bias / mlp_bias (false), hidden_act ("silu", the only one
// accepted), torch_dtype or dtype, bos_token_id, eos_token_id (an int, a list
// of ints, or null). The newer "rope_parameters" object (rope_type,
// rope_theta, scaling fields) is read when "rope_scaling" is absent. Integer
// fields must be JSON integers; unknown keys are ignored.
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/dtype.h"

namespace tessera::model {

// Upper bounds on the sizes in a config, far above any released model, so a
// corrupt file cannot make later code allocate absurd amounts of memory.
// Token ids are int32, hence the vocabulary bound.
inline constexpr int64_t kMaxVocabSize = 2147483647;
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 20;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 22;
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxHeadDim = 8192;
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 30;

enum class ModelArchitecture { kLlama, kMistral, kQwen2, kQwen3 };

// "LlamaForCausalLM", ...
std::string_view ArchitectureName(ModelArchitecture arch);

enum class RopeScalingType {
  kNone,    // plain RoPE (rope_type "default" or no rope_scaling)
  kLinear,  // position interpolation: every inverse frequency / factor
  kLlama3,  // Llama 3.1 frequency-dependent scaling (see rope.h)
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                           // linear, llama3; >= 1
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3; > low_freq_factor
  int64_t original_max_position_embeddings = 0;  // llama3; > 0
};

struct ModelConfig {
  ModelArchitecture architecture = ModelArchitecture::kLlama;
  std::string model_type;  // "llama", "mistral", "qwen2", "qwen3"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // divides num_attention_heads (GQA)
  int64_t head_dim = 0;             // even
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  bool qkv_bias = false;     // q_proj/k_proj/v_proj have a bias
  bool o_proj_bias = false;  // o_proj has a bias
  bool mlp_bias = false;     // gate/up/down_proj have a bias
  bool qk_norm = false;      // Qwen3 q_norm/k_norm

  std::optional<DType> torch_dtype;  // the dtype the model was saved in
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // possibly empty

  // Sliding-window attention: set when at least one layer uses a window;
  // `sliding_window_layers` counts those layers. The kernels attend over the
  // whole context, so CheckContextLength refuses contexts beyond the window.
  std::optional<int64_t> sliding_window;
  int64_t sliding_window_layers = 0;

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  int64_t queries_per_kv() const { return num_attention_heads / num_key_value_heads; }
};

// Parses config.json text. `source` (a path) prefixes every error message;
// errors are INVALID_ARGUMENT naming the key and the problem.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text,
                                             std::string_view source = "config.json");

// Reads `path`: a config.json file or a model directory holding one.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// Tessera runs full causal attention. That equals the model's attention only
// while no sequence is longer than its sliding window, so serving up to
// `max_model_len` tokens is refused (FAILED_PRECONDITION, naming the window
// and the largest safe length) when a window is enabled and smaller. Also
// refuses max_model_len < 1.
absl::Status CheckContextLength(const ModelConfig& config, int64_t max_model_len);

}  // namespace tessera::model
