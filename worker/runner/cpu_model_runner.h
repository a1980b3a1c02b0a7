// CpuModelRunner: the forward pass of Llama / Mistral / Qwen2 / Qwen3
// decoders on the CPU kernels (kernels/cpu), over a paged fp32 KV cache.
//
// Per layer (HF order; FusedAddRmsNorm keeps the residual stream):
//   h = RMSNorm(x)                         (layer 0; later layers fuse the add)
//   qkv = h · [Wq; Wk; Wv]^T (+ bias)      one GEMM over the fused weight
//   q, k = per-head RMSNorm (Qwen3)        then RoPE at the tokens' positions
//   cache[slots] = k, v                    paged attention over the cache
//   a = attention · Wo^T;  h = RMSNorm(a + residual)
//   m = silu(h · Wg^T) * (h · Wu^T)        one GEMM over [Wg; Wu]
//   x = m · Wd^T
// then the final RMSNorm and the LM head for the requested rows only.
//
// Weights: q/k/v and gate/up are fused into owned copies at load (in the
// checkpoint's dtype); other matrices are used in place from the memory map
// when aligned, else copied. Norm weights and biases are widened to fp32.
//
// Thread-safety: not thread-safe (one engine loop owns it); kernels use the
// context's thread pool.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu_backend.h"
#include "worker/model/weights.h"
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
  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override;

 private:
  struct Layer;
  struct Ops;
  CpuModelRunner(const model::LoadedModel* model, CpuRunnerOptions options);
  absl::Status PrepareWeights();
  absl::Status ValidateBatch(const ForwardBatch& batch) const;
  void RunLayer(int index, const ForwardBatch& batch, int64_t num_tokens);

  const model::LoadedModel* model_;
  CpuRunnerOptions options_;
  std::unique_ptr<kernels::cpu::ThreadPool> own_pool_;
  kernels::cpu::CpuContext ctx_;
  kernels::CpuKernels kernels_;

  std::vector<std::vector<std::byte>> owned_;  // fused / aligned weight copies
  std::vector<Layer> layers_;
  kernels::cpu::WeightMatrix embed_;
  kernels::cpu::WeightMatrix lm_head_;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;

  std::vector<float> k_cache_, v_cache_;  // [layers][blocks, block, kv_heads, head_dim]

  // Workspace, resized per batch.
  std::vector<float> x_, residual_, qkv_, q_, k_, v_, attn_, gate_up_, act_, rows_;
};

}  // namespace tessera::runner
