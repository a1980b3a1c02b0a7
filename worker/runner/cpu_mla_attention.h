// CpuMlaAttention: multi-head latent attention (DeepSeek-V3, Kimi K2;
// worker/model/mla_config.h) for one decoder layer on the CPU, over a paged
// latent KV cache. The CPU reference the CUDA kernels are checked against.
//
// The cache holds, per token and layer, latent_dim() = kv_lora_rank +
// qk_rope_head_dim fp32 values at its slot (the slots of the engine's block
// manager, as for GQA): the normalised latent c, then the roped k_pe shared
// by all heads. Nothing per head is cached.
//
// Per token (h = head; W_UK_h, W_UV_h = head h's dn k_nope rows and dv v
// rows of kv_b_proj, each [., kv_lora_rank]):
//   q = q_b(RMSNorm(q_a(x))) or q_proj(x);  q_pe_h = RoPE(q_pe_h)
//   [c, k_pe] = kv_a(x);  c = RMSNorm(c);  k_pe = RoPE(k_pe)  -> cache[slot]
//   absorbed (MlaForm::kAbsorbed, the decode form):
//     q_lat_h = W_UK_h^T q_nope_h                     [kv_lora_rank]
//     s_j     = scale * (q_lat_h . c_j + q_pe_h . k_pe_j)
//     out_h   = W_UV_h (sum_j softmax(s)_j c_j)
//   naive (MlaForm::kNaive, the reference of the former):
//     k_nope_hj = W_UK_h c_j,  v_hj = W_UV_h c_j
//     s_j       = scale * (q_nope_h . k_nope_hj + q_pe_h . k_pe_j)
//     out_h     = sum_j softmax(s)_j v_hj
//   x_out = o_proj([out_0 ... out_{n-1}])
// The two forms are equal in exact arithmetic (matrix products
// reassociated); cpu_mla_attention_test.cc checks them against each other.
// j runs over the token's context: the cached positions before its chunk
// and, within the chunk, the causal prefix or (ForwardBatch::tree_parents)
// its ancestors and itself. RoPE uses the config's inverse frequencies with
// cos and sin scaled by rope_attention_factor, pairs (2i, 2i+1) under
// rope_interleave (the result in transformers' de-interleaved order), else
// (i, i + dr/2).
//
// Weights: q_a/q_b/q, kv_a and o_proj through CpuLinear (dense or FP8);
// kv_b_proj widened to fp32 at load (an FP8 kv_b_proj exactly dequantized:
// the absorbed products use it per head, without activation quantization,
// as vLLM and SGLang do). Unsharded only.
//
// Thread-safety: Run is const and reentrant given distinct scratch, cache
// rows and outputs; the attention loop runs on the context's pool.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu_backend.h"
#include "worker/model/config.h"
#include "worker/model/weights.h"
#include "worker/runner/cpu_linear.h"
#include "worker/runner/cpu_weight_loader.h"
#include "worker/runner/forward_batch.h"

namespace tessera::runner {

enum class MlaForm { kAbsorbed, kNaive };

// One layer's latent cache: [num_slots, latent_dim] floats.
struct MlaLatentCache {
  float* data = nullptr;
  int64_t num_slots = 0;
  int64_t latent_dim = 0;
  int block_size = 0;
};

// Buffers one layer's Run grows as needed.
struct MlaScratch {
  std::vector<float> q_a, q, kv_a, latent, attn;
};

class CpuMlaAttention {
 public:
  // Layer `weights` of `config` (which must have config.mla); matrices via
  // `loader`, which must outlive the block. `inv_freq`: the RoPE table
  // (qk_rope_head_dim / 2 entries, worker/model/rope.h).
  static absl::StatusOr<CpuMlaAttention> Prepare(const model::ModelConfig& config,
                                                 const model::LayerWeights& weights,
                                                 std::vector<float> inv_freq,
                                                 CpuWeightLoader* loader);

  // out [n, H] = the attention block's output (after o_proj) for the
  // normalised hidden states x [n, H] of `batch`'s tokens; writes their
  // latents into `cache` first. REQUIRES: the batch is valid for the cache
  // (slots and block tables inside it), out does not overlap x.
  void Run(const kernels::cpu::CpuContext& ctx, const kernels::CpuKernels& k, const float* x,
           const ForwardBatch& batch, const MlaLatentCache& cache, MlaForm form,
           MlaScratch* scratch, float* out) const;

  const model::MlaConfig& mla() const { return mla_; }

 private:
  // RoPE in place on one vector of qk_rope_head_dim values at `position`.
  void Rope(int32_t position, float* x) const;
  // Head `head`'s attention for its query q [dn + dr] over the latents at
  // `slots`, into out [dv].
  void AttendOne(const float* q, int64_t head, absl::Span<const int64_t> slots,
                 const MlaLatentCache& cache, MlaForm form, float* out) const;

  model::MlaConfig mla_;
  int64_t heads_ = 0;
  std::vector<float> inv_freq_;
  CpuLinear q_a_, q_b_, q_, kv_a_, o_;  // q_a_/q_b_ when q_lora_rank > 0, else q_
  std::vector<float> q_a_norm_, kv_a_norm_;
  std::vector<float> kv_b_;  // [heads * (dn + dv), kv_lora_rank]
};

}  // namespace tessera::runner
