// The forward pass of a Llama / Mistral / Qwen2 / Qwen3 decoder on one GPU,
// as modules a step calls in order (CudaModelRunner::RunModel):
//
//   Embed                       ids -> residual (and the first input norm)
//   per layer:
//     AttentionBlock            xb -> delta (this rank's partial o_proj sum)
//     residual add + post norm  (RankReduce::AddNorm)
//     MlpBlock                  xb -> delta (partial down_proj sum)
//     residual add + next norm
//   LmHead                      final norm's rows that want logits -> logits
//
// A StepPlan, decided once per step, says which fused paths apply; the
// modules read it and never decide on their own. AttentionBlock (grouped-
// query attention today) and MlpBlock (dense, or mixture of experts:
// cuda_moe_block.h) are the seams where other attention and MLP kinds plug
// in; CudaLinear is the seam for other weight formats.
//
// Numerics: bf16 weights and sublayer activations, fp32 residual stream,
// fp32 norm/softmax/accumulation, fp32 logits.
//
// Thread-safety: one rank's thread; the modules only queue work on the
// step's stream.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/model/config.h"
#include "worker/runner/cuda/cuda_kv_cache.h"
#include "worker/runner/cuda/cuda_weights.h"
#include "worker/runner/cuda/rank_reduce.h"
#include "worker/runner/cuda/staged_batch.h"

namespace tessera::kernels::cuda {
class GemmContext;
}  // namespace tessera::kernels::cuda

namespace tessera::runner {

class MoeRoutingObserver;  // worker/runner/cpu_mlp_block.h

// Which kernels a step runs, decided once before it.
struct StepPlan {
  int64_t tokens = 0;  // rows of every activation (padded for graphs)
  int seqs = 0;
  int64_t logits_rows = 0;  // rows the LM head computes (0: none)
  int max_seq_len = 0;
  int max_query_len = 0;
  bool decode = false;  // every sequence has one new token
  bool tree = false;    // a chunk branches (ancestor masks staged)
  // The qkv GEMV rotates q/k and writes K/V in its epilogue (RoPE-ordered
  // rows, a step of <= 8 tokens the GEMV takes).
  bool rope_in_qkv_gemv = false;
  // Otherwise, on decode steps: RoPE, q/k norms and the K/V write inside
  // the decode attention kernel; prefill steps run the Rope kernel.
  bool rope_in_attention = false;
  // Prefill attention through the wgmma kernel where it supports the shape.
  bool prefill_sm90 = false;
  // The embedding is looked up in bf16 and the ranks' sum is taken by the
  // first input norm (one p2p kernel instead of an fp32 all-reduce).
  bool p2p_embedding = false;
  // SiLU·mul in the staged gate/up GEMV's epilogue: dense layers, and the
  // shared experts of MoE layers (their own width).
  bool gate_up_silu_in_gemv = false;
  bool shared_gate_up_silu_in_gemv = false;
};

// Activations of one step, sized for the runner's largest step.
struct CudaActivations {
  kernels::cuda::DeviceBuffer residual;  // fp32 [T, hidden]
  kernels::cuda::DeviceBuffer xb;        // bf16 [T, hidden]: the normed input of a sublayer
  kernels::cuda::DeviceBuffer qkv;       // bf16 [T, q + 2 kv]
  kernels::cuda::DeviceBuffer attn;      // bf16 [T, q]
  kernels::cuda::DeviceBuffer delta;     // bf16 [T, hidden]: a sublayer's output
  kernels::cuda::DeviceBuffer gate_up;   // bf16 [T, 2 W], W = DenseMlpWidth
  kernels::cuda::DeviceBuffer act;       // bf16 [T, W]
  // MoE layers (empty for dense models), sized for moe_max_tokens rows:
  kernels::cuda::DeviceBuffer router_logits;    // fp32 [2T, E] (cuda_moe_block.h)
  kernels::cuda::DeviceBuffer router_split;     // bf16 [2T, hidden]: the router input's halves
  kernels::cuda::DeviceBuffer router_counters;  // int32 [T], zeros: the fused router's
  kernels::cuda::DeviceBuffer moe_ids;          // int32 [T, top_k]
  kernels::cuda::DeviceBuffer moe_weights;      // fp32 [T, top_k]
  kernels::cuda::DeviceBuffer shared_out;       // bf16 [T, hidden]: the shared experts' output
  kernels::cuda::DeviceBuffer moe_workspace;    // kernels/cuda/moe_experts.h
  int64_t moe_max_tokens = 0;
  kernels::cuda::DeviceBuffer rows;    // bf16 [logits rows, hidden]
  kernels::cuda::DeviceBuffer logits;  // fp32 [logits rows, vocab slice]
  kernels::cuda::DeviceBuffer attn_workspace;
};

// What every module of a step reads.
struct ForwardContext {
  const model::ModelConfig* config = nullptr;
  const CudaWeights* weights = nullptr;
  const StagedBatch* batch = nullptr;
  const CudaKvCache* kv = nullptr;
  CudaActivations* act = nullptr;
  kernels::cuda::GemmContext* gemm = nullptr;
  const RankReduce* reduce = nullptr;
  kernels::cuda::CudaStream stream = nullptr;
  int64_t heads = 0, kv_heads = 0, inter = 0, vocab = 0;  // this rank's
  int block_size = 16;
  MoeRoutingObserver* routing_observer = nullptr;  // CudaRunnerOptions::routing_observer
};

// Token ids -> the residual stream, and the first layer's input norm -> xb.
absl::Status Embed(const ForwardContext& c, const StepPlan& plan);
// xb -> delta: qkv projection, RoPE and the K/V write, paged attention,
// o_proj, for layer `layer`.
absl::Status AttentionBlock(const ForwardContext& c, const StepPlan& plan, int64_t layer);
// xb -> delta: the MLP of layer `layer`, dense or mixture of experts.
absl::Status MlpBlock(const ForwardContext& c, const StepPlan& plan, int64_t layer);
// out = down(SiLU(gate(xb)) * up(xb)) of width `width` (a dense layer, or
// the shared experts), SiLU·mul in the gate/up GEMV when `silu_in_gemv`.
absl::Status DenseMlp(const ForwardContext& c, const StepPlan& plan, const CudaLinear& gate_up,
                      const CudaLinear& down, int64_t width, bool silu_in_gemv,
                      kernels::cuda::Bf16* out);
// delta summed over the ranks into the residual, then xb = RMSNorm · w.
absl::Status AddAndNorm(const ForwardContext& c, const StepPlan& plan,
                        const kernels::cuda::DeviceBuffer& norm);
// The staged logits rows of xb (after the final norm) -> logits.
absl::Status LmHead(const ForwardContext& c, const StepPlan& plan);

}  // namespace tessera::runner
