// ModelConfig: the parts of a Hugging Face `config.json` the runtime needs,
// parsed and validated, for the decoder-only architectures Tessera runs:
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// and the mixture-of-experts Qwen3MoeForCausalLM and Glm4MoeForCausalLM.
//
// All are pre-norm decoders: RMSNorm -> attention (GQA, RoPE) -> residual
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
//   Qwen3-MoE: Qwen3's attention; the MLP of layer l is sparse (MoE) unless
//            l is in mlp_only_layers or (l + 1) % decoder_sparse_step != 0
//            (or num_experts is 0). Keys: num_experts (transformers 5 writes
//            num_local_experts; both are read, and must agree when both are
//            given; default 128), num_experts_per_tok (8),
//            moe_intermediate_size (768), norm_topk_prob (false),
//            decoder_sparse_step (1, >= 1), mlp_only_layers ([], entries in
//            [0, num_hidden_layers)). Softmax routing, no shared experts.
//   GLM-4.5: q/k/v bias = attention_bias, never an o_proj bias; q/k norm
//            when use_qk_norm (false); RoPE over the first rotary_dim() =
//            int(head_dim * partial_rotary_factor) dims of each head
//            (partial_rotary_factor at the top level or inside
//            rope_parameters; default 0.5, as transformers). Layers >=
//            first_k_dense_replace (1) are sparse. Keys: n_routed_experts
//            (or num_local_experts; 128), num_experts_per_tok (8),
//            moe_intermediate_size (1408), n_shared_experts (1),
//            n_group (1), topk_group (1), routed_scaling_factor (1.0),
//            norm_topk_prob (true), num_nextn_predict_layers (1: the
//            multi-token-prediction layers stored after the decoder layers,
//            which Tessera skips). Sigmoid routing with a correction bias.
//   DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM, model_type deepseek_v3 or
//            kimi_k2): multi-head latent attention (`mla`, mla_config.h and
//            deepseek_v3_config.h); GLM-4.5's routing keys with DeepSeek's
//            defaults (256 experts, top-8, 8 groups, top-4 groups, scaling
//            2.5, moe_intermediate_size 2048, first_k_dense_replace 3,
//            num_nextn_predict_layers 0); rope_scaling may be "yarn".
//   MoE validation (INVALID_ARGUMENT naming the keys): 1 <= top_k <=
//            experts; n_group divides experts; 1 <= topk_group <= n_group;
//            top_k <= topk_group * (experts / n_group); groups of at least 2
//            experts (a group is scored by its top two); a positive finite
//            routed_scaling_factor; n_shared_experts >= 0.
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
// fields must be JSON integers; unknown keys are ignored. An FP8
// quantization_config is parsed and checked by quantization.h.
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
#include "worker/model/mla_config.h"
#include "worker/model/quantization.h"

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

enum class ModelArchitecture {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kQwen3Moe,
  kGlm4Moe,
  kDeepseekV3,
};

// "LlamaForCausalLM", ...
std::string_view ArchitectureName(ModelArchitecture arch);

enum class RopeScalingType {
  kNone,    // plain RoPE (rope_type "default" or no rope_scaling)
  kLinear,  // position interpolation: every inverse frequency / factor
  kLlama3,  // Llama 3.1 frequency-dependent scaling (see rope.h)
  kYarn,    // YaRN (DeepSeek-V3 only: its attention factor scales cos/sin)
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                           // linear, llama3; >= 1
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3; > low_freq_factor
  int64_t original_max_position_embeddings = 0;  // llama3, yarn; > 0
  // YaRN (rope.h). mscale / mscale_all_dim 0 = absent.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  std::optional<double> attention_factor;  // explicit; else from the mscales
  bool truncate = true;
};

// How a router turns its logits into each token's experts and weights;
// kernels/cpu/moe_routing.h has the exact arithmetic of both.
enum class MoeScoring {
  kSoftmax,         // Qwen3-MoE: softmax -> top-k -> optional renormalisation
  kSigmoidGrouped,  // GLM-4.5 / DeepSeek-V3: sigmoid, + correction bias for the
                    // choice only, group-limited top-k, weights from the
                    // unbiased scores (optionally normalised) x scaling factor
};

// The mixture-of-experts part of a config (see the header comment).
struct MoeConfig {
  MoeScoring scoring = MoeScoring::kSoftmax;
  int64_t num_experts = 0;             // routed experts
  int64_t top_k = 0;                   // num_experts_per_tok
  int64_t intermediate_size = 0;       // moe_intermediate_size: one expert's width
  bool norm_topk_prob = false;         // renormalise a token's k weights to sum 1
  int64_t num_shared_experts = 0;      // always-on experts (one MLP, see below)
  int64_t n_group = 1;                 // expert groups (sigmoid scoring)
  int64_t topk_group = 1;              // groups a token may choose experts from
  double routed_scaling_factor = 1.0;  // multiplies the routed weights
  std::vector<bool> sparse_layers;     // per decoder layer: MoE (true) or dense MLP

  // The shared experts run as one SwiGLU MLP of this width (transformers'
  // shared_experts module), added to the routed experts' output.
  int64_t shared_intermediate_size() const { return intermediate_size * num_shared_experts; }
  int64_t group_size() const { return num_experts / n_group; }
  // Sigmoid scoring has a per-expert e_score_correction_bias in the router.
  bool has_correction_bias() const { return scoring == MoeScoring::kSigmoidGrouped; }
};

struct ModelConfig {
  ModelArchitecture architecture = ModelArchitecture::kLlama;
  std::string model_type;  // "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "glm4_moe",
                           // "deepseek_v3", "kimi_k2"

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
  bool qk_norm = false;      // Qwen3 q_norm/k_norm (GLM-4.5: use_qk_norm)

  // RoPE rotates the first rotary_dim() dims of each head (GLM-4.5: half).
  double partial_rotary_factor = 1.0;  // in (0, 1]

  // Mixture of experts (Qwen3-MoE, GLM-4.5); unset for dense models.
  std::optional<MoeConfig> moe;
  // Multi-token-prediction layers a GLM-4.5 checkpoint stores as
  // model.layers.<num_hidden_layers + i>.*; not run, skipped at load.
  int64_t num_nextn_predict_layers = 0;

  // Multi-head latent attention (DeepSeek-V3, Kimi K2); unset otherwise.
  // Then head_dim = qk_rope_head_dim and q_size()/kv_size() do not apply.
  std::optional<MlaConfig> mla;

  // FP8 checkpoints: config.json's quantization_config (quantization.h);
  // unset for bf16/fp16/fp32 weights.
  std::optional<QuantizationConfig> quantization;

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
  // As transformers: int(head_dim * partial_rotary_factor); even, >= 2.
  int64_t rotary_dim() const { return static_cast<int64_t>(head_dim * partial_rotary_factor); }
  // Whether decoder layer `layer` has a mixture-of-experts MLP.
  bool IsSparseLayer(int64_t layer) const {
    return moe.has_value() && layer >= 0 &&
           layer < static_cast<int64_t>(moe->sparse_layers.size()) &&
           moe->sparse_layers[static_cast<size_t>(layer)];
  }
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
