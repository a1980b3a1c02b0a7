// The mixture-of-experts MLP block of one decoder layer on the GPU (behind
// MlpBlock, cuda_forward.h), the same math as the CPU runner's
// (worker/runner/cpu_mlp_block.h):
//   logits  = xb . router^T                  fp32 [T, E] (bf16 inputs, fp32 sums)
//   ids, w  = route(logits)                  kernels/cuda/moe_routing.h, on the device
//   shared  = the shared experts' SwiGLU(xb) bf16 [T, H] (GLM-4.5; when any)
//   delta   = sum of the chosen experts' SwiGLU(xb) x w, + shared, in fp32,
//             one rounding to bf16           kernels/cuda/moe_experts.h
// The caller's residual add + norm (AddAndNorm) follows, as for a dense
// block. Nothing here reads device memory back or waits for the host, so a
// decode step with MoE layers is captured as a CUDA graph like any other;
// the experts' path (pair GEMVs, grouped GEMVs or grouped GEMM) is chosen on
// the host from the step's token count alone.
//
// Sharded, the delta is this rank's partial sum (its experts or expert
// slices, and its slice of the shared experts), which the all-reduce in the
// next AddAndNorm sums: every rank routes every token with the whole
// router, so the ranks agree on the choices.
//
// Thread-safety: queues work on the context's stream only.
#pragma once

#include "absl/status/status.h"
#include "worker/runner/cuda/cuda_forward.h"
#include "worker/runner/cuda/cuda_weights.h"

namespace tessera::runner {

// xb -> delta for a sparse layer with weights `moe`.
absl::Status MoeBlock(const ForwardContext& c, const StepPlan& plan, const CudaMoeWeights& moe);

}  // namespace tessera::runner
