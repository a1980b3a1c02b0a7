// ModelWeights: every tensor a decoder forward pass needs, located in a
// checkpoint and checked against the ModelConfig, without copying or
// converting anything (views into the checkpoint's memory map).
//
// For the forward pass:
//   - every member is a TensorView: dtype (F32, F16 or BF16; tensors may
//     differ in dtype), shape, and a pointer to dense row-major little-endian
//     bytes that may be unaligned (see tensor.h);
//   - Linear weights have the Hugging Face / torch layout [out_features,
//     in_features]: y = x @ W^T (+ b), i.e. y[o] = sum_i W[o, i] * x[i];
//   - shapes, with H = hidden_size, I = intermediate_size, V = vocab_size,
//     D = head_dim, Q = num_attention_heads * D, K = num_key_value_heads * D:
//       embed_tokens [V, H]    (row t is token t's embedding)
//       input_layernorm, post_attention_layernorm, norm  [H]
//       q_proj [Q, H]  k_proj [K, H]  v_proj [K, H]  o_proj [H, Q]
//       q_bias [Q]  k_bias [K]  v_bias [K]  o_bias [H]          (optional)
//       q_norm [D]  k_norm [D]   (Qwen3: RMSNorm over each head, eps =
//                                 rms_norm_eps, before RoPE)
//       gate_proj [I, H]  up_proj [I, H]  down_proj [H, I]
//       gate_bias [I]  up_bias [I]  down_bias [H]               (optional)
//       lm_head [V, H]  (the embed_tokens view when tied)
//     Mixture-of-experts layers (config.IsSparseLayer(l); then gate_proj,
//     up_proj and down_proj of the layer are unset), E = moe.num_experts,
//     J = moe.intermediate_size, S = moe.shared_intermediate_size():
//       mlp.gate.weight [E, H]                   the router
//       mlp.gate.e_score_correction_bias [E]     (sigmoid scoring only)
//       mlp.experts.<e>.{gate,up}_proj.weight [J, H], .down_proj.weight [H, J]
//       mlp.shared_experts.{gate,up}_proj.weight [S, H], .down_proj [H, S]
//                                                (when S > 0)
//     or, instead of the per-expert tensors, the fused layout of
//     transformers' in-memory Experts module: mlp.experts.gate_up_proj
//     [E, 2J, H] (gate rows first) and mlp.experts.down_proj [E, H, J];
//     each expert's views then point into those tensors.
//     Multi-head latent attention (config.mla; then q/k/v_proj are unset),
//     n = heads, dn/dr/dv = qk_nope/qk_rope/v head dims, r = kv_lora_rank,
//     rq = q_lora_rank (mla_config.h):
//       self_attn.q_a_proj [rq, H], q_a_layernorm [rq], q_b_proj [n(dn+dr), rq]
//         or, when rq = 0, self_attn.q_proj [n(dn+dr), H]
//       self_attn.kv_a_proj_with_mqa [r + dr, H], kv_a_layernorm [r],
//       self_attn.kv_b_proj [n(dn+dv), r]   (head h: dn k_nope rows, dv v rows)
//       self_attn.o_proj [H, n dv]
//     Head h of q occupies rows [h*D, (h+1)*D) of q_proj; query head h reads
//     key/value head h / (num_attention_heads / num_key_value_heads).
//   - RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight (Llama/Qwen: weight as
//     is, no "1 + weight" offset).
//
// Binding rules: every required tensor must exist (NOT_FOUND naming it),
// have the expected shape (INVALID_ARGUMENT naming the tensor, the expected
// and the actual shape) and a float dtype F32/F16/BF16. With
// tie_word_embeddings an lm_head.weight in the checkpoint is ignored, as
// transformers does. Tensors of layers >= num_hidden_layers
// ("model.layers.N." with N too large) mean the config does not match the
// checkpoint and are an error, except the num_nextn_predict_layers
// multi-token-prediction layers right after them (GLM-4.5 stores its MTP
// module as layer num_hidden_layers), which are skipped with a log line and
// listed in `skipped_tensors`; other unknown tensors (e.g. old
// rotary_emb.inv_freq buffers) are listed in `unused_tensors`.
//
// FP8 checkpoints (config.quantization, worker/model/quantization.h): the
// linear projections of the decoder layers (q/k/v/o, gate/up/down, experts'
// and shared experts') that the quantization config quantizes are F8_E4M3
// views of the same shapes, and their scales are in LayerWeights::fp8, keyed
// by the weight's tensor name; every other tensor is F32/F16/BF16 as above.
// CheckFp8Linear's rules apply to each.
//
// Lifetime: views point into the Checkpoint; keep it alive (LoadedModel does).
// Thread-safety: immutable after binding; safe to read from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/model/checkpoint.h"
#include "worker/model/config.h"
#include "worker/model/tensor.h"

namespace tessera::model {

// One SwiGLU MLP's matrices (a routed expert, or the shared experts).
struct ExpertWeights {
  TensorView gate_proj;  // [J, H]
  TensorView up_proj;    // [J, H]
  TensorView down_proj;  // [H, J]
};

struct MoeWeights {
  TensorView router;                          // [E, H]
  std::optional<TensorView> correction_bias;  // [E], sigmoid scoring
  std::vector<ExpertWeights> experts;         // E entries
  std::optional<ExpertWeights> shared;        // width S, when S > 0
};

// The scales of one FP8 linear (quantization.h): the weight scale
// (weight_scale_inv for fine-grained, weight_scale for compressed-tensors) and,
// for static activation quantization, the input scale.
struct Fp8Scales {
  TensorView weight_scale;
  std::optional<TensorView> input_scale;
};

// A multi-head latent attention layer's projections (o_proj is
// LayerWeights::o_proj).
struct MlaWeights {
  std::optional<TensorView> q_proj;         // [n(dn+dr), H] when q_lora_rank = 0
  std::optional<TensorView> q_a_proj;       // [rq, H]
  std::optional<TensorView> q_a_layernorm;  // [rq]
  std::optional<TensorView> q_b_proj;       // [n(dn+dr), rq]
  TensorView kv_a_proj_with_mqa;            // [r + dr, H]
  TensorView kv_a_layernorm;                // [r]
  TensorView kv_b_proj;                     // [n(dn+dv), r]
};

struct LayerWeights {
  TensorView input_layernorm;                               // [H]
  TensorView q_proj;                                        // [Q, H]
  TensorView k_proj;                                        // [K, H]
  TensorView v_proj;                                        // [K, H]
  TensorView o_proj;                                        // [H, Q]
  std::optional<TensorView> q_bias, k_bias, v_bias;         // when config.qkv_bias
  std::optional<TensorView> o_bias;                         // when config.o_proj_bias
  std::optional<TensorView> q_norm, k_norm;                 // [D], when config.qk_norm
  TensorView post_attention_layernorm;                      // [H]
  TensorView gate_proj;                                     // [I, H]
  TensorView up_proj;                                       // [I, H]
  TensorView down_proj;                                     // [H, I]
  std::optional<TensorView> gate_bias, up_bias, down_bias;  // when config.mlp_bias
  std::optional<MoeWeights> moe;  // sparse layers (the dense MLP fields unset)
  std::optional<MlaWeights> mla;  // config.mla (q/k/v_proj unset)
  // FP8 linears of this layer: weight tensor name -> scales. Empty for
  // unquantized checkpoints.
  absl::flat_hash_map<std::string, Fp8Scales> fp8;

  // The scales of `weight` when it is an FP8 linear of this layer, else null.
  const Fp8Scales* Fp8ScalesOf(const TensorView& weight) const {
    auto it = fp8.find(weight.name);
    return it == fp8.end() ? nullptr : &it->second;
  }
};

struct ModelWeights {
  TensorView embed_tokens;                   // [V, H]
  std::vector<LayerWeights> layers;          // config.num_hidden_layers entries
  TensorView norm;                           // [H]
  TensorView lm_head;                        // [V, H]
  bool lm_head_tied = false;                 // lm_head views embed_tokens' bytes
  std::vector<std::string> unused_tensors;   // checkpoint tensors not bound, sorted
  std::vector<std::string> skipped_tensors;  // multi-token-prediction layers, sorted
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// The tensors `config` needs with their shapes, in a stable order
// (embedding, layers 0..L-1, final norm, lm_head unless tied).
std::vector<TensorSpec> RequiredTensors(const ModelConfig& config);
// Their names alone.
std::vector<std::string> RequiredTensorNames(const ModelConfig& config);

// Locates and checks every tensor (see the rules above). The first problem
// found is returned.
absl::StatusOr<ModelWeights> BindModelWeights(const ModelConfig& config,
                                              const Checkpoint& checkpoint);

// A model directory opened as one unit: config.json, the checkpoint and the
// bound weights, owning the memory map the views point into.
struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;
  ModelWeights weights;
};

// Loads `dir` (config.json + model.safetensors or its sharded index).
absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& dir);

}  // namespace tessera::model
