// CpuModelRunner: the forward pass of Llama / Mistral / Qwen2 / Qwen3
// decoders and the Qwen3-MoE / GLM-4.5 mixture-of-experts decoders on the
// CPU kernels (kernels/cpu), over a paged fp32 KV cache.
//
// Per layer (HF order; FusedAddRmsNorm keeps the residual stream):
//   h = RMSNorm(x)                         (layer 0; later layers fuse the add)
//   qkv = h · [Wq; Wk; Wv]^T (+ bias)      one GEMM over the fused weight
//   q, k = per-head RMSNorm (Qwen3)        then RoPE at the tokens' positions
//                                          (GLM-4.5: over rotary_dim() dims)
//   cache[slots] = k, v                    paged attention over the cache
//   a = attention · Wo^T;  h = RMSNorm(a + residual)
//   x = MLP(h)                             cpu_mlp_block.h: dense SwiGLU
//                                          (one GEMM over [Wg; Wu], SiLU-mul,
//                                          down) or a mixture of experts
// then the final RMSNorm and the LM head for the requested rows only.
//
// Weights (cpu_weight_loader.h): q/k/v and gate/up are fused into owned
// copies at load (in the checkpoint's dtype); other matrices are used in
// place from the memory map when aligned, else copied. Norm weights and
// biases are widened to fp32. FP8 checkpoints (worker/model/quantization.h)
// run every linear projection through CpuLinear's FP8 parts (kFp8Gemm, the
// reference arithmetic of kernels/cpu/fp8_linear.h), unsharded only.
//
// Token trees (ForwardBatch::tree_parents): the attention kernel runs over
// the whole batch as for chains, then the rows of the chunks that branch are
// recomputed here with the tree mask (the cached context plus the token's
// ancestors and itself); K/V are written to each token's own slot as usual.
// CopyKvSlots moves K/V between slots in every layer.
//
// Multi-head latent attention (DeepSeek-V3, Kimi K2; config.mla): each
// layer's attention is a CpuMlaAttention, and its cache holds one latent
// row (kv_lora_rank + qk_rope_head_dim values) per slot instead of K and V;
// slots, blocks, prefix caching and CopyKvSlots are unchanged. Unsharded
// only.
//
// Tensor parallelism: with CpuRunnerOptions::shard the runner is one rank of
// a group (worker/parallel/shard_plan.h): it reads only its slice of each
// matrix from the memory map (row slices in place, column slices of o_proj
// and down_proj as strided copies), keeps only its KV heads, and calls the
// group's collectives after o_proj and down_proj (all-reduce), after the
// vocab-parallel embedding (all-reduce) and for the LM head (gather to rank
// 0). MoE layers are split as the plan's MoeParallelism says (a slice of
// every expert, or whole experts per rank); their partial outputs meet in
// the same all-reduce after the MLP. worker/parallel/tensor_parallel_runner.h
// drives the ranks.
//
// Thread-safety: not thread-safe (one engine loop owns it); kernels use the
// context's thread pool.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu_backend.h"
#include "worker/model/weights.h"
#include "worker/parallel/collectives.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cpu_linear.h"
#include "worker/runner/cpu_mla_attention.h"
#include "worker/runner/cpu_mlp_block.h"
#include "worker/runner/cpu_weight_loader.h"
#include "worker/runner/model_runner.h"

namespace tessera::runner {

struct CpuRunnerOptions {
  int block_size = 16;
  int64_t num_kv_blocks = 256;
  // The kernels per op, as the registry chose them (kernels/cpu_backend.h);
  // null = the optimized `cpu` backend for every op.
  const kernels::CpuKernels* kernels = nullptr;
  // Threads for the optimized kernels; 0 = the default pool.
  int num_threads = 0;
  // This runner is rank shard->rank of a tensor-parallel group: it holds
  // that rank's shard only and meets the other ranks through `collectives`
  // (required then; it must outlive the runner). Every rank must be given
  // the same batches in the same order. Unset: the whole model.
  std::optional<parallel::ShardPlan> shard;
  parallel::Collectives* collectives = nullptr;
  // Sees every MoE layer's routing decisions (tests, tracing); may be null.
  // Must outlive the runner.
  MoeRoutingObserver* routing_observer = nullptr;
  // Multi-head latent attention models (config.mla): the form every step
  // runs (cpu_mla_attention.h); the naive form is for tests.
  MlaForm mla_form = MlaForm::kAbsorbed;
};

class CpuModelRunner final : public ModelRunner {
 public:
  // Prepares the weights of `model` (which must outlive the runner) and
  // allocates the KV cache.
  static absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(const model::LoadedModel* model,
                                                                CpuRunnerOptions options);
  ~CpuModelRunner() override;

  const model::ModelConfig& config() const override { return model_->config; }
  int block_size() const override { return options_.block_size; }
  int64_t num_kv_blocks() const override { return options_.num_kv_blocks; }
  // With a shard, rank 0 returns the full logits (gathered from the ranks)
  // and the other ranks an empty vector.
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;
  bool SupportsTreeAttention() const override { return true; }
  absl::Status CopyKvSlots(absl::Span<const int64_t> from, absl::Span<const int64_t> to) override;

  // The part of the model this runner holds (the full plan when unsharded).
  const parallel::ShardPlan& shard_plan() const { return plan_; }

 private:
  struct Layer;
  struct Ops;
  CpuModelRunner(const model::LoadedModel* model, CpuRunnerOptions options);
  absl::Status PrepareWeights();
  absl::Status PrepareAttention(const model::LayerWeights& weights, Layer* layer);
  absl::Status ValidateBatch(const ForwardBatch& batch) const;
  void Embed(const ForwardBatch& batch, int64_t num_tokens);
  void RunLayer(int index, const ForwardBatch& batch, int64_t num_tokens);
  // GQA attention of layer `l`: x_ (normalised) -> x_ (after o_proj).
  void RunAttention(const Layer& l, const ForwardBatch& batch, int64_t num_tokens);
  // RoPE on q_ and k_ at the batch's positions, full or partial.
  void ApplyRope(const ForwardBatch& batch, int heads, int kv_heads);
  // Attention rows of the chunks in `batch` that branch, with the tree mask.
  void TreeAttention(const Layer& l, const ForwardBatch& batch, float scale);
  void AllReduce(float* data, int64_t n);  // no-op when unsharded

  const model::LoadedModel* model_;
  CpuRunnerOptions options_;
  parallel::ShardPlan plan_;
  std::unique_ptr<kernels::cpu::ThreadPool> own_pool_;
  kernels::cpu::CpuContext ctx_;
  kernels::CpuKernels kernels_;

  CpuWeightLoader loader_;  // owns fused / aligned weight copies; before layers_
  std::vector<Layer> layers_;
  kernels::cpu::WeightMatrix embed_;
  kernels::cpu::WeightMatrix lm_head_;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;

  std::vector<float> k_cache_, v_cache_;  // [layers][blocks, block, kv_heads, head_dim]

  // Workspace, resized per batch.
  std::vector<float> x_, residual_, qkv_, q_, k_, v_, attn_, mlp_out_, rows_;
  MlpScratch mlp_scratch_;
  MlaScratch mla_scratch_;
  std::vector<int32_t> local_ids_;                 // sharded embedding: ids in this vocab slice
  std::vector<int64_t> local_rows_;                // ... and the tokens they belong to
  std::vector<float> local_embed_, local_logits_;  // sharded embedding rows / logits slice
};

}  // namespace tessera::runner
