// The mixture-of-experts MLP block of one decoder layer on the GPU (behind
// MlpBlock, cuda_forward.h), the same math as the CPU runner's
// (worker/runner/cpu_mlp_block.h):
//   x       = RMSNorm(residual) * post_norm  fp32 (xb is x rounded to bf16)
//   logits  = x . router^T                   fp32 [T, E], from x, not xb
//   ids, w  = route(logits)                  on the device, in fp32
//             (kernels/cuda/moe_router.h: one fused kernel for decode
//             steps; a hi/lo split GEMM then MoeRoute for longer ones)
//   shared  = the shared experts' SwiGLU(xb) bf16 [T, H] (GLM-4.5; when any)
//   delta   = sum of the chosen experts' SwiGLU(xb) x w, + shared, in fp32,
//             one rounding to bf16           kernels/cuda/moe_experts.h
// Routing from the fp32 x is what the CPU runner and transformers' fp32
// models do; from xb, a bf16 rounding of x flips choices where a token's
// k-th and (k+1)-th scores are that close (cuda_moe_runner_test).
// The caller's residual add + norm (AddAndNorm) follows, as for a dense
// block. Nothing here reads device memory back or waits for the host
// (unless a test's routing observer is set: eager steps only), so a
// decode step with MoE layers is captured as a CUDA graph like any other;
// the experts' path (pair GEMVs, grouped GEMVs or grouped GEMM) is chosen on
// the host from the step's token count alone.
//
// Sharded, the delta is this rank's partial sum (its experts or expert
// slices, and its slice of the shared experts), which the all-reduce in the
// next AddAndNorm sums: every rank routes every token with the whole
// router from the same residual, so the ranks agree on the choices.
//
// Thread-safety: queues work on the context's stream only.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/device_buffer.h"
#include "worker/runner/cuda/cuda_forward.h"
#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::runner {

// xb -> delta for sparse layer `layer` with weights `moe`, whose
// post-attention norm weight `post_norm` made xb from the residual.
absl::Status MoeBlock(const ForwardContext& c, const StepPlan& plan, const CudaMoeWeights& moe,
                      const kernels::cuda::DeviceBuffer& post_norm, int layer);

}  // namespace tessera::runner
