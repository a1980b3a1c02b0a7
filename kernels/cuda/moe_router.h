// The router of a sparse layer on the GPU, in fp32 from the fp32 residual
// stream, as the CPU runner and transformers' fp32 models route:
//   x_t      = RMSNorm(residual_t) * norm   fp32 (the post-attention norm)
//   logits_t = x_t . router^T               fp32 sums of exact products
//                                           (bf16 router weights)
//   ids, w   = route(logits_t)              moe_routing.h, on the device
// The experts' input xb is the same x rounded to bf16. Routing from xb
// instead (what the runner did before) moves every logit by up to a bf16
// rounding of x, enough to flip a token's k-th and (k+1)-th expert where
// their scores are that close.
//
// Two ways, the caller choosing by token count:
//   - MoeRouteFromResidual (num_tokens <= kMoeFusedRouterMaxTokens, decode
//     steps): one kernel. CTA (expert block, token) computes the token's
//     norm, the logits of kMoeRouterExpertsPerCta experts, and the last
//     CTA of a token to finish (a per-token arrival counter, which that
//     CTA resets to zero, so CUDA graph replays find it zeroed) routes the
//     token. Launched as a programmatic dependent where the device takes
//     it: the router rows are loaded before the wait for the kernel before
//     (the residual's writer), so their latency hides behind its tail.
//   - MoeRouterSplitInput (prefill steps): x_t as two bf16 rows, hi =
//     bf16(x) in row t and lo = bf16(x - hi) in row T + t; one bf16 GEMM of
//     those 2T rows gives both halves' logits exactly summed in fp32, and
//     MoeRoute(.., addend = the lo half) adds them: hi + lo carries x to
//     about 2^-17 relative, fp32-grade for routing, at tensor-core speed.
//
// Thread-safety: enqueues on `stream`; the counters belong to one call at a
// time.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_types.h"
#include "kernels/cuda/moe_routing.h"

namespace tessera::kernels::cuda {

inline constexpr int64_t kMoeFusedRouterMaxTokens = 64;
inline constexpr int kMoeRouterExpertsPerCta = 8;
inline constexpr int64_t kMoeRouterMaxHidden = 12288;  // x in 48 KB of shared memory

struct MoeRouterArgs {
  const float* residual = nullptr;  // [T, H] fp32
  const float* norm = nullptr;      // [H] fp32 RMSNorm weight
  float eps = 1e-6f;
  int64_t num_tokens = 0;
  int64_t hidden = 0;            // H: a multiple of 8, <= kMoeRouterMaxHidden
  const Bf16* router = nullptr;  // [E, H], 16-byte aligned
  MoeRoutingParams routing;      // E = routing.num_experts
  float* logits = nullptr;       // [T, E] out
  int32_t* counters = nullptr;   // [T] zeros (left zeros); unused when E <= 8
  int32_t* experts = nullptr;    // [T, k] out
  float* weights = nullptr;      // [T, k] out
  bool programmatic = true;      // a programmatic dependent launch where supported
};

// INVALID_ARGUMENT for bad routing parameters, shapes or pointers, or more
// than kMoeFusedRouterMaxTokens tokens.
absl::Status MoeRouteFromResidual(const MoeRouterArgs& args, CudaStream stream);

// split[t] = bf16(x_t), split[T + t] = bf16(x_t - bf16(x_t)) for t < T, x
// as above (device pointers; split holds [2T, H]).
absl::Status MoeRouterSplitInput(const float* residual, const float* norm, float eps,
                                 int64_t num_tokens, int64_t hidden, Bf16* split,
                                 CudaStream stream);

}  // namespace tessera::kernels::cuda
