// CudaWeights: one rank's weights on its GPU, in the layouts the forward
// pass reads (worker/runner/cuda/cuda_forward.h).
//
// Every matrix is bf16 [out, in] row-major, every norm weight and bias fp32.
// q/k/v are fused into one linear layer, as are gate/up. Two row layouts
// serve the GEMV epilogues of one-token steps (kernels/cuda/gemv.h):
//   - qkv_rope_order: each q and k head's rows in GemvRopeRow order, so the
//     qkv GEMV rotates and writes the KV cache itself (models without
//     per-head q/k norms, head_dim a multiple of 16);
//   - gate_up_interleaved: [gate; up] rows in GemvGateUpRow order, so the
//     staged gate/up GEMV applies SiLU·mul (intermediate size a multiple
//     of 4); SiluMul reads that order on longer steps.
// Partial RoPE (GLM-4.5: rotary_dim() R < head_dim D): the kernels rotate
// pairs (i, i + D/2) of whole heads, the model pairs (i, i + R/2) of the
// first R dims. The q and k rows of each head (and their biases and q/k
// norm weights) are stored permuted so that model pair (i, i + R/2) sits at
// (i, i + D/2) and the D - R pass-through dims fill the other slots; the
// inv_freq table has D/2 entries, the model's R/2 and then zeros (angle 0:
// cos 1, sin 0, exactly the identity). q.k is unchanged by a permutation
// applied to both, RMSNorm over a head too; v is not permuted, so the
// attention output is the model's (PartialRotaryOrder).
// Mixture-of-experts layers (config.IsSparseLayer) hold CudaMoeWeights
// instead of gate_up/down: the router (bf16, fp32 logits), the correction
// bias, every held expert stacked as kernels/cuda/moe_expert_weights.h
// wants, and the shared experts as a dense gate/up + down pair.
// FP8 checkpoints (config.quantization): every quantized linear holds
// CudaFp8Parts (cuda_linear.h): e4m3 bytes as stored and the scale grid of
// each tensor, sliced for the plan (block scales only at multiples of 128,
// CheckCudaFp8Support), merged where they stack; the two fused row layouts
// above are off (their GEMV epilogues read bf16 weights), and fp8_plan
// says which kernels run which linears.
// With a tensor-parallel plan the weights are that rank's slices
// (Megatron-style: q/k/v heads, gate/up rows and vocabulary rows; o_proj
// and down_proj columns), and row biases only on the rank that adds them.
//
// Thread-safety: plain data; UploadWeights uses the current device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/moe_expert_weights.h"
#include "kernels/cuda/moe_routing.h"
#include "worker/model/config.h"
#include "worker/model/weights.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cuda/cuda_linear.h"

namespace tessera::runner {

// One sparse layer's MoE weights (this rank's experts and slices).
struct CudaMoeWeights {
  CudaLinear router;                            // [E, H], every expert (replicated)
  kernels::cuda::DeviceBuffer correction_bias;  // fp32 [E]; empty = none
  kernels::cuda::DeviceBuffer gate_up;          // bf16 [held, 2J, H]: gate rows, then up
  kernels::cuda::DeviceBuffer down;             // bf16 [held, H, J]
  int num_experts = 0;                          // held here
  int32_t first_expert = 0;                     // global id of held expert 0
  int64_t inter = 0;                            // J on this rank
  CudaLinear shared_gate_up, shared_down;       // shared experts; out = 0: none
  int64_t shared_inter = 0;                     // their width S on this rank
  // The config's routing; correction_bias points into the buffer above.
  kernels::cuda::MoeRoutingParams routing;

  bool has_shared() const { return shared_inter > 0; }
  kernels::cuda::MoeExpertWeights experts(int64_t hidden) const {
    return {gate_up.as<kernels::cuda::Bf16>(), down.as<kernels::cuda::Bf16>(), num_experts, hidden,
            inter};
  }
};

struct CudaLayerWeights {
  CudaLinear qkv;                     // [q rows; k rows; v rows]
  CudaLinear o;                       // o_proj
  CudaLinear gate_up;                 // [gate; up], or interleaved (see above)
  CudaLinear down;                    // down_proj
  std::optional<CudaMoeWeights> moe;  // sparse layers (gate_up/down then empty)
  kernels::cuda::DeviceBuffer input_norm, post_norm;
  kernels::cuda::DeviceBuffer q_norm, k_norm;  // per-head RMSNorm (Qwen3); empty = none
};

struct CudaWeights {
  kernels::cuda::DeviceBuffer embed;        // bf16 [vocab slice, hidden]
  kernels::cuda::DeviceBuffer lm_head_own;  // bf16 [vocab slice, hidden]; empty = tied
  kernels::cuda::DeviceBuffer final_norm;   // fp32 [hidden]
  kernels::cuda::DeviceBuffer inv_freq;     // fp32 RoPE inverse frequencies
  std::vector<CudaLayerWeights> layers;
  bool qkv_rope_order = false;
  bool gate_up_interleaved = false;
  int64_t bytes = 0;  // matrices on the device (bf16, or e4m3 + scales)
  // FP8 models: the linears' scratch, and one line for logs and `tessera
  // doctor`-style reports: decode / prefill kernels per linear kind, and the
  // fused paths switched off and why. Empty otherwise.
  std::unique_ptr<CudaFp8Workspace> fp8_workspace;
  std::string fp8_plan;

  const kernels::cuda::Bf16* lm_head() const {
    return (lm_head_own.size() != 0 ? lm_head_own : embed).as<kernels::cuda::Bf16>();
  }
};

// The layouts above, as a model and a plan decide them (interleaved gate/up
// covers the dense MLPs and the shared experts alike; neither for FP8
// models, see above).
bool UsesQkvRopeOrder(const model::ModelConfig& config);
bool UsesGateUpInterleaved(const parallel::ShardPlan& plan);

// The partial-RoPE row order of one head (see above): entry i is the
// model's dim stored at row i. The identity when rotary == head_dim.
std::vector<int64_t> PartialRotaryOrder(int64_t head_dim, int64_t rotary);

// The routing kernel's parameters for `moe` (correction_bias unset);
// INVALID_ARGUMENT when the kernel cannot route it.
absl::StatusOr<kernels::cuda::MoeRoutingParams> MoeRoutingFor(const model::MoeConfig& moe);

// The widest dense gate/up + down a step runs (dense layers, shared
// experts) on this rank: the activations' gate_up / act width.
int64_t DenseMlpWidth(const model::ModelConfig& config, const parallel::ShardPlan& plan);

// Where a runner's weights come from, for one rank's plan, made on the
// current device: the checkpoint (UploadWeights), or any other source of
// the same layouts (benchmarks make random ones).
using CudaWeightsFactory = std::function<absl::StatusOr<CudaWeights>(
    const model::ModelConfig& config, const parallel::ShardPlan& plan)>;

// The weights of `model` for `plan`, copied to the current device
// (fp32/fp16 checkpoints converted to bf16). Every slice is bounds-checked
// against the tensor (worker/model/tensor.h); errors name the tensor.
absl::StatusOr<CudaWeights> UploadWeights(const model::LoadedModel& model,
                                          const parallel::ShardPlan& plan);

// FP8 checkpoints: which prefill kernel the parts that can take it run
// (cuBLASLt's block-scaled GEMM needs 128x128 weight scales, activations
// per group of 128 and no bias; the rest dequantize). Default: the
// registry's choice for the visible GPUs (SelectCudaFp8Prefill).
struct CudaFp8UploadOptions {
  std::optional<CudaFp8Prefill> prefill;
};
absl::StatusOr<CudaWeights> UploadWeights(const model::LoadedModel& model,
                                          const parallel::ShardPlan& plan,
                                          const CudaFp8UploadOptions& fp8);

// One line describing an FP8 model's kernels (CudaWeights::fp8_plan).
std::string DescribeFp8Plan(const CudaWeights& weights);

// RoPE inverse frequencies of `config` as the kernels read them (head_dim
// / 2 entries; partial RoPE padded with zeros, see above), on the current
// device.
absl::StatusOr<kernels::cuda::DeviceBuffer> UploadRopeFrequencies(const model::ModelConfig& config);

// A device buffer of `bytes`, or RESOURCE_EXHAUSTED naming `what`.
absl::StatusOr<kernels::cuda::DeviceBuffer> AllocateDevice(size_t bytes, std::string_view what);

}  // namespace tessera::runner
