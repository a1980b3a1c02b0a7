// The last step of the MoE experts on the GPU: each token's expert outputs
// weighted by its routing weights and summed in fp32,
//   out[t] = sum over its pairs j held here, in ascending expert order,
//            of weights[t, j] * y[pair_row[t, j]]   (+ shared[t])
// rounded once to bf16: the runner's MLP output (the delta its fused
// add-RMSNorm adds to the fp32 residual). Summing in expert order, as the
// CPU kernels and transformers' expert loop do, makes a token's output
// independent of the order the router listed its experts in. `shared`
// (optional, bf16 [T, H]) is the shared experts' output (GLM-4.5,
// DeepSeek-V3), added last. A token without any pair held here (expert
// parallelism) gets 0 (+ shared).
//
// Thread-safety: enqueues on `stream`; out must not overlap the inputs.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/moe_grouping.h"

namespace tessera::kernels::cuda {

struct MoeCombineArgs {
  const Bf16* y = nullptr;            // grouped expert outputs [rows, H]
  const int32_t* ids = nullptr;       // [T, k] expert ids (the order of the sum)
  const float* weights = nullptr;     // [T, k]
  const MoeGroups* groups = nullptr;  // pair_row of this step's grouping
  const Bf16* shared = nullptr;       // [T, H] or null
  int64_t num_tokens = 0;
  int64_t hidden = 0;   // % 8 == 0
  Bf16* out = nullptr;  // [T, H]
};

absl::Status MoeCombine(const MoeCombineArgs& args, CudaStream stream);

}  // namespace tessera::kernels::cuda
