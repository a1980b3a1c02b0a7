// CudaWeights: one rank's weights on its GPU, in the layouts the forward
// pass reads (worker/runner/cuda/cuda_layers.h).
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
// With a tensor-parallel plan the weights are that rank's slices
// (Megatron-style: q/k/v heads, gate/up rows and vocabulary rows; o_proj
// and down_proj columns), and row biases only on the rank that adds them.
//
// Thread-safety: plain data; UploadWeights uses the current device.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/model/config.h"
#include "worker/model/weights.h"
#include "worker/parallel/shard_plan.h"
#include "worker/runner/cuda/cuda_linear.h"

namespace tessera::runner {

struct CudaLayerWeights {
  CudaLinear qkv;      // [q rows; k rows; v rows]
  CudaLinear o;        // o_proj
  CudaLinear gate_up;  // [gate; up], or interleaved (see above)
  CudaLinear down;     // down_proj
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
  int64_t bytes = 0;  // bf16 matrices on the device

  const kernels::cuda::Bf16* lm_head() const {
    return (lm_head_own.size() != 0 ? lm_head_own : embed).as<kernels::cuda::Bf16>();
  }
};

// The layouts above, as a model and a plan decide them.
bool UsesQkvRopeOrder(const model::ModelConfig& config);
bool UsesGateUpInterleaved(const parallel::ShardPlan& plan);

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

// RoPE inverse frequencies of `config`, on the current device.
absl::StatusOr<kernels::cuda::DeviceBuffer> UploadRopeFrequencies(
    const model::ModelConfig& config);

// A device buffer of `bytes`, or RESOURCE_EXHAUSTED naming `what`.
absl::StatusOr<kernels::cuda::DeviceBuffer> AllocateDevice(size_t bytes, std::string_view what);

}  // namespace tessera::runner
